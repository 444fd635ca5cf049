"""The normal form of a forwarded query: what makes two data calls the same request (an `Idempotency-Key`'s
repeat, and an answer cache keyed the same way)."""

import urllib.parse


def normalized_query(query: str) -> str:
    """`query` as forwarded (handlers/social.py `upstream_query`), in one spelling: parameters ordered by name
    and percent-encoded one way, so `?query=coffee&queryType=Latest` and `?queryType=Latest&query=%63offee` are
    one request. Every forwarded parameter counts, repeats of one the table does not name too, in their order
    (the provider may read the first or the last); the API key travels in a header and never counts."""
    # latin-1 both ways: each byte of a value stays that byte, whatever it encodes.
    pairs = urllib.parse.parse_qsl(query, keep_blank_values=True, encoding="latin-1")
    return urllib.parse.urlencode(sorted(pairs, key=lambda pair: pair[0]), encoding="latin-1")
