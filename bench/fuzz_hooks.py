"""Schemathesis hooks of bench/fuzz.py (loaded through SCHEMATHESIS_HOOKS).

An Idempotency-Key names one request: the service answers 422 when a key comes back with another request
(handlers/idempotent.py), a rule no schema can state. The fuzzer draws keys from the header's schema and draws
the same short ones again and again ("0", "A"), so each schema-valid key it sends is made its own here; a
schema-invalid one is sent as drawn, to be refused as such.
"""

import itertools
import re

import schemathesis

from handlers.idempotent import HEADER, KEY, PATTERN

_VALID = re.compile(PATTERN)
_SENT = itertools.count()


@schemathesis.hook
def before_call(context, case, **kwargs) -> None:
    key = (case.headers or {}).get(HEADER)
    if isinstance(key, str) and len(key) <= KEY.max_length and _VALID.fullmatch(key):
        # Unique by its last ".N"; a key at the length bound keeps its length (the coverage phase's boundary).
        suffix = f".{next(_SENT)}"
        fits = len(key) + len(suffix) <= KEY.max_length
        case.headers[HEADER] = key + suffix if fits else key[: len(key) - len(suffix)] + suffix
