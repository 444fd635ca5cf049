"""SocialData (docs.socialdata.tools): Twitter v1.1-style objects at its own paths, `Authorization: Bearer`.
A stub until its mapping lands: it serves nothing, so nothing is routed to it."""

from social.endpoints import Endpoint


class SocialData:
    kind = "socialdata"

    def serves(self, endpoint: Endpoint) -> bool:
        return False

    def headers(self, secret: str) -> bytes:
        return f"Authorization: Bearer {secret}\r\nAccept: application/json\r\n".encode("latin-1")

    def request(self, endpoint: Endpoint, query: str) -> tuple[str, str]:
        raise LookupError(endpoint.path)

    def answer(self, endpoint: Endpoint, status: int, body: bytes) -> tuple[int, bytes]:
        raise LookupError(endpoint.path)


ADAPTER = SocialData()
