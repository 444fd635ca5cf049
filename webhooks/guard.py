"""SSRF guard for webhook endpoints: which URLs may be registered, and which addresses may be connected to.

In production (`GATEWAY_ENV=production`) an endpoint must be https, and every address its host resolves
to must be public: loopback, private, link-local (169.254.169.254, the cloud metadata service, included),
unique local, site-local, multicast, reserved, unspecified, shared (100.64/10) and documentation addresses are
refused. An IPv6 address that carries an IPv4 one (`IPV6_FORMS`: mapped, NAT64, 6to4) is judged by the IPv4
address it leads to; the forms that tunnel or translate to an address nobody can check here (Teredo, local-use
NAT64, IPv4-compatible and -translated) are refused whole. The table is explicit rather than left to
`ipaddress`'s flags, which differ between Python versions (3.11 calls fec0::1 and 2002:7f00:1::1 global).
The check runs at registration and again at every connection (`GuardedResolver`: the HTTP client connects
to the very addresses checked, so DNS rebinding between the two gets nowhere), with the original Host and
SNI. `WEBHOOK_ALLOW_PRIVATE=true` lifts the address check for on-premise receivers. Development allows
http and loopback so that local receivers work.
"""

import ipaddress
import socket
from collections.abc import Callable
from urllib.parse import urlsplit

from tornado.netutil import DefaultLoopResolver, Resolver

MAX_URL = 2000
IPv4 = ipaddress.IPv4Address
IPv6 = ipaddress.IPv6Address


def _low32(address: IPv6) -> IPv4:
    return IPv4(int(address) & 0xFFFFFFFF)


def _sixtofour(address: IPv6) -> IPv4:
    return IPv4((int(address) >> 80) & 0xFFFFFFFF)  # 2002:AABB:CCDD::/48 leads to AA.BB.CC.DD


# (IPv6 network, what it is, the IPv4 address it leads to; None: refused whole), first match decides.
IPV6_FORMS: tuple[tuple[ipaddress.IPv6Network, str, Callable[[IPv6], IPv4] | None], ...] = tuple(
    (ipaddress.IPv6Network(network), name, embedded)
    for network, name, embedded in (
        ("::/128", "not a unicast address", None),
        ("::1/128", "a loopback address", None),
        ("::ffff:0:0/96", "IPv4-mapped", _low32),
        ("::ffff:0:0:0/96", "an IPv4-translated address", None),
        ("::/96", "an IPv4-compatible address (deprecated)", None),
        ("64:ff9b::/96", "NAT64", _low32),
        ("64:ff9b:1::/48", "a local-use NAT64 address", None),
        ("2002::/16", "6to4", _sixtofour),
        ("2001::/32", "a Teredo tunnel address", None),
        ("fec0::/10", "a site-local address", None),
        ("2001:db8::/32", "a documentation address", None),
        ("3fff::/20", "a documentation address", None),
    )
)


class Refused(Exception):
    """A URL or address a webhook may not reach; the message says why (safe to show to its owner)."""


def refused_address(text: str) -> str | None:
    """Why a connection to this address is refused, None when it is a public address."""
    try:
        address = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return "not an IP address"
    if address.version == 6:
        for network, name, embedded in IPV6_FORMS:
            if address in network:
                if embedded is None:
                    return name
                reason = _refused(embedded(address))
                return f"{reason} in {name} form" if reason else None
    return _refused(address)


def _refused(address: ipaddress.IPv4Address | IPv6) -> str | None:
    if address.is_loopback:
        return "a loopback address"
    if address.is_link_local:
        return "a link-local address (cloud metadata included)"
    if address.is_multicast or address.is_unspecified or address.is_reserved:
        return "not a unicast address"
    if address.is_private or (address.version == 4 and address in ipaddress.ip_network("100.64.0.0/10")):
        return "a private address"
    if not address.is_global:
        return "not a public address"
    return None


def check_url(url: str, production: bool) -> str:
    """The URL's host; Refused when it cannot be an endpoint (scheme, form). Addresses are checked apart."""
    if len(url) > MAX_URL or not url.isascii() or not url.isprintable() or " " in url:
        raise Refused("not a valid URL")
    parts = urlsplit(url)
    allowed = ("https",) if production else ("https", "http")
    if parts.scheme not in allowed:
        raise Refused("the URL must be https" if production else "the URL must be http or https")
    if not parts.hostname or parts.username or parts.password:
        raise Refused("the URL needs a host and no credentials")
    try:
        parts.port  # noqa: B018 - raises for a port out of range
    except ValueError:
        raise Refused("not a valid port") from None
    return parts.hostname


class GuardedResolver(Resolver):
    """Tornado's resolver that refuses (raises Refused) when any address of a host is not allowed; the
    connection is then made to the addresses it returned, and only to those."""

    def initialize(self, allow_private: bool = False) -> None:
        self.inner = DefaultLoopResolver()
        self.allow_private = allow_private

    async def resolve(self, host: str, port: int, family: socket.AddressFamily = socket.AF_UNSPEC):
        infos = await self.inner.resolve(host, port, family)
        if not self.allow_private:
            for _, sockaddr in infos:
                reason = refused_address(sockaddr[0])
                if reason:
                    raise Refused(f"{host} resolves to {reason}")
        return infos


async def check_host(host: str, port: int, allow_private: bool) -> None:
    """Registration's check of a host's addresses (the connection checks again)."""
    try:
        await GuardedResolver(allow_private=allow_private).resolve(host, port)
    except OSError:
        raise Refused(f"{host} does not resolve") from None
