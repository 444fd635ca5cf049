"""Client addresses as the gateway compares them: an IPv4-mapped IPv6 address is its IPv4 address, so one
allowlist or trusted-proxy entry covers a client however its connection reached us."""

import ipaddress


def parse_address(text: str):
    """An address object (IPv4-mapped IPv6 as IPv4), None if `text` is not an address."""
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    return address.ipv4_mapped or address if address.version == 6 else address


def within(address, networks: tuple) -> bool:
    """Whether a parsed address (None: never) is in one of `networks`."""
    return address is not None and any(address in network for network in networks)
