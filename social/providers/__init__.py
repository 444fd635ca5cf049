"""Providers: who answers a data call. One adapter module per kind of provider (`twitterapi`: the provider our
spec resells; `socialdata`: SocialData), each mapping our endpoint and its validated query to the provider's
request, and the provider's answer to our canonical shape (the spec's and the provider-compatible shapes served
today). `social/endpoints.py` stays our contract (parameters, price, page size); an adapter only maps it.

Adding a kind is one more module here, registered in KINDS, and a sandbox dialect (sandbox/dialects/)."""

from dataclasses import dataclass
from typing import Protocol

from social.endpoints import Endpoint


class Adapter(Protocol):
    """One kind of provider. Cursors here are the provider's own: pinning a cursor to the provider that issued it
    is the router's business, not the adapter's."""

    kind: str

    def serves(self, endpoint: Endpoint) -> bool:
        """Whether this kind can answer the endpoint at all (an endpoint it cannot serve is never routed to it)."""
        ...

    def headers(self, secret: str) -> bytes:
        """The request's header lines for one of the provider's keys (CRLF-terminated, Latin-1)."""
        ...

    def request(self, endpoint: Endpoint, query: str) -> tuple[str, str]:
        """(path after the provider's base URL, percent-encoded query) for our endpoint and validated query."""
        ...

    def answer(self, endpoint: Endpoint, status: int, body: bytes) -> tuple[int, bytes]:
        """The provider's answer as ours: canonical status and body (a field with no counterpart is null, never
        invented)."""
        ...


@dataclass(slots=True)  # not frozen: one is built per provider call, and a frozen one costs 4-5 x as much to build
class Attempt:
    """One request put to a provider on a call's behalf (a failed-over call makes several): what the operator's
    cost ledger records, whether or not the customer was charged. Read-only by convention."""

    at: float  # wall-clock seconds when the attempt ended
    provider: str  # its name in PROVIDERS
    endpoint: str  # our path after /social
    status: int  # the provider's HTTP status; 0: no answer (`error` says why)
    error: str  # "" or an UpstreamError kind: timeout, unreachable, unavailable, failed, busy, saturated
    items: int  # items in the answer (0 for a failure or an empty page)
    cost_usd: float  # what the operator owes the provider for it, by its cost table (0 when it bills nothing)
    seconds: float  # how long it took
    account: str  # whose call it was (the ledger is the operator's; never shown to another account)


def adapter(kind: str) -> Adapter:
    """The adapter of a kind named in PROVIDERS."""
    from social.providers import socialdata, twitterapi  # the modules import this one for Adapter

    return {"twitterapi": twitterapi.ADAPTER, "socialdata": socialdata.ADAPTER}[kind]


KINDS = ("twitterapi", "socialdata")
