"""The provider our spec resells (twitterapi.io): its paths are ours after /social, its answers are already our
shape, so a request and an answer pass through unchanged (nothing parsed: the single-provider path costs what it
did)."""

from social.endpoints import Endpoint


class TwitterApi:
    kind = "twitterapi"

    def serves(self, endpoint: Endpoint) -> bool:
        return endpoint.available

    def headers(self, secret: str) -> bytes:
        return f"X-API-Key: {secret}\r\nAccept: application/json\r\n".encode("latin-1")

    def request(self, endpoint: Endpoint, query: str) -> tuple[str, str]:
        return endpoint.path, query

    def answer(self, endpoint: Endpoint, status: int, body: bytes) -> tuple[int, bytes]:
        return status, body


ADAPTER = TwitterApi()
