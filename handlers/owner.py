"""The owner worker's side of the answer cache's loopback link (accounting/tiers.py): a sibling worker asks for
the answer of a key this worker owns, or tells it to drop one it kept for a call that was not charged. Served
on the loopback application of `serve --workers N` (handlers/ops/handlers.py peer_app), with the run's secret."""

import hmac
from dataclasses import replace

from accounting.charged import Call
from accounting.tiers import ANSWER_PATH, DROP_PATH, SECRET_HEADER, encode
from handlers.base import BaseHandler
from handlers.errors import ApiError
from social.endpoints import BY_PATH


class _PeerHandler(BaseHandler):
    def prepare(self) -> None:
        given = self.request.headers.get(SECRET_HEADER, "").encode()
        secret = self.ctx.data.calls.tiers.secret
        if not secret or not hmac.compare_digest(given, secret):
            raise ApiError(401, "Not authenticated")

    def on_finish(self) -> None:
        """A hand-over between workers, not a request to the service: neither counted nor logged."""


class PeerAnswerHandler(_PeerHandler):
    async def get(self) -> None:
        arg = self.get_query_argument
        endpoint = BY_PATH.get(arg("path"))
        if endpoint is None:
            raise ApiError(404, "Unknown endpoint")
        call = Call(endpoint, arg("q"), int(arg("size")), arg("account"), float(arg("rate")), float(arg("fresh")))
        if arg("cursor", ""):
            call = replace(call, cursor=arg("cursor"))
        self.finish(encode(await self.ctx.data.calls.answer_peer(self.ctx.data.upstream, call)))


class PeerDropHandler(_PeerHandler):
    def get(self) -> None:
        self.ctx.data.calls.drop_peer(self.get_query_argument("key"), float(self.get_query_argument("at")))
        self.finish(b"")


routes = [(ANSWER_PATH, PeerAnswerHandler), (DROP_PATH, PeerDropHandler)]
