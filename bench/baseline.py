"""The benchmark's baseline: a bare Tornado proxy as a user would write it by hand, with Tornado's pooled
libcurl client (CurlAsyncHTTPClient) and nothing else (no keys, no limits, no credits, no usage records)."""

import argparse
import asyncio
import os

import tornado.web
from tornado.curl_httpclient import CurlAsyncHTTPClient
from tornado.httpclient import HTTPRequest
from tornado.simple_httpclient import SimpleAsyncHTTPClient

from social.endpoints import BY_PATH


class Proxy(tornado.web.RequestHandler):
    def initialize(self, http, base: str, key: str) -> None:
        self.http, self.base, self.key = http, base, key

    async def get(self, path: str) -> None:
        if path not in BY_PATH:
            raise tornado.web.HTTPError(404)
        query = self.request.query
        request = HTTPRequest(
            self.base + path + ("?" + query if query else ""),
            headers={"X-API-Key": self.key, "Accept": "application/json"},
            connect_timeout=2.0,
            request_timeout=15.0,
            follow_redirects=False,
        )
        response = await self.http.fetch(request, raise_error=False)
        self.set_status(response.code)
        self.set_header("Content-Type", "application/json")
        self.finish(response.body)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--upstream-key", required=True)
    parser.add_argument("--max-clients", type=int, default=64, help="connections to the upstream at once")
    parser.add_argument(
        "--client",
        choices=["curl", "simple"],
        default="curl",
        help="curl: Tornado's pooled libcurl client; simple: Tornado's default client, for comparison",
    )
    args = parser.parse_args()
    client = CurlAsyncHTTPClient if args.client == "curl" else SimpleAsyncHTTPClient
    http = client(force_instance=True, max_clients=args.max_clients)
    handler = {"http": http, "base": args.upstream.rstrip("/") + "/twitter", "key": args.upstream_key}
    tornado.web.Application([(r"/social(/.*)", Proxy, handler)]).listen(args.port, "127.0.0.1")
    await asyncio.Event().wait()


if __name__ == "__main__":
    if os.environ.get("EVENT_LOOP") == "uvloop":  # as the gateway's EVENT_LOOP, for `--loop uvloop`
        import uvloop

        uvloop.install()
    asyncio.run(main())
