"""The benchmark's baseline: a bare Tornado proxy with the gateway's own upstream client and nothing else
(no keys, no limits, no credits, no usage records)."""

import argparse
import asyncio
import os

import tornado.web
from tornado.simple_httpclient import SimpleAsyncHTTPClient

from social.endpoints import BY_PATH
from social.upstream import Breaker, UpstreamClient


class Proxy(tornado.web.RequestHandler):
    def initialize(self, upstream: UpstreamClient) -> None:
        self.upstream = upstream

    async def get(self, path: str) -> None:
        if path not in BY_PATH:
            raise tornado.web.HTTPError(404)
        response = await self.upstream.get(path, self.request.query)
        self.set_status(response.status)
        self.set_header("Content-Type", "application/json")
        self.finish(response.body)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--upstream-key", required=True)
    parser.add_argument(
        "--client",
        choices=["curl", "simple"],
        default="curl",
        help="curl: the gateway's pooled client; simple: Tornado's default client, for comparison",
    )
    args = parser.parse_args()
    upstream = UpstreamClient(args.upstream, args.upstream_key, "/twitter", 2.0, 15.0, 64, 8 << 20, Breaker(10**9, 1))
    if args.client == "simple":
        upstream.http.close()
        upstream.http = SimpleAsyncHTTPClient(force_instance=True, max_clients=64)
    tornado.web.Application([(r"/social(/.*)", Proxy, {"upstream": upstream})]).listen(args.port, "127.0.0.1")
    await asyncio.Event().wait()


if __name__ == "__main__":
    if (
        os.environ.get("EVENT_LOOP") == "uvloop"
    ):  # as the gateway's EVENT_LOOP, for `./dev bench --static --loop uvloop`
        import uvloop

        uvloop.install()
    asyncio.run(main())
