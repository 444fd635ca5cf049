"""The price sheet a customer reads before spending (issue 47): per data endpoint, its price rule in words, the
least a call costs and the most (a full page, what is reserved), how long its answer stays fresh in the answer
cache and what a repeat costs then. Made from the terms of the running settings at each request (PRICE_RULES,
CACHE_TTL, CACHE_MAX_BYTES, CACHE_HIT_PRICE), never from a copy, so a SIGHUP reload of the price rules shows at
once; the very `Prices` the charged call uses (metering/pricing.py) computes every figure. Read by GET /prices
(the portal's Prices view) and by the OpenAPI document's data operations (handlers/openapi_paths.py)."""

import functools
import math
from dataclasses import dataclass

import orjson

from config.settings import Settings
from metering.pricing import Prices
from social.answer_cache import ttl_of
from social.endpoints import ENDPOINTS, Endpoint

# What one item of an answer is, for a price "per" item: by the rule first (profiles), else by the answer's list.
_UNIT_BY_RULE = {"profiles": "profile", "batch_profiles": "profile"}
_UNIT = {
    "tweets": "tweet",
    "replies": "tweet",
    "followers": "follower",
    "followings": "account followed",
    "users": "profile",
    "ids": "id",
    "members": "member",
    "trends": "trend",
    "article": "article",
    "data": "item",
}


@dataclass(frozen=True)
class Terms:
    """What the sheet depends on, as plain values: hashable, so a document built from them can be kept while
    they stay the same."""

    price_rules: bytes  # PRICE_RULES as JSON (sorted keys)
    cache_ttl: bytes  # CACHE_TTL as JSON (sorted keys)
    cache_on: bool  # CACHE_MAX_BYTES > 0
    hit_price: float  # CACHE_HIT_PRICE: the fraction of a call's price a cached answer costs
    credits_per_usd: int

    @staticmethod
    def of(settings: Settings) -> "Terms":
        return Terms(
            orjson.dumps(dict(settings.price_rules), option=orjson.OPT_SORT_KEYS),
            orjson.dumps(dict(settings.cache_ttl), option=orjson.OPT_SORT_KEYS),
            settings.cache_max_bytes > 0,
            settings.cache_hit_price,
            settings.credits_per_usd,
        )


def _n(value: float) -> str:
    return f"{value:,g}" if value < 1_000_000 else f"{value:,.0f}"


def _unit(endpoint: Endpoint) -> str:
    return _UNIT_BY_RULE.get(endpoint.price) or _UNIT.get(endpoint.results, "item")


def _size_words(endpoint: Endpoint, start: float) -> str:
    """The condition of a tier: the page size asked for, as the endpoint knows it."""
    size = endpoint.size
    param = endpoint.param(size.param) if size.param else None
    if param is not None and param.kind == "ids":
        return f"with {_n(start)} or more ids asked"
    if size.param:
        return f"at {size.param} {_n(start)} or more"
    return f"at pages of {_n(start)} or more"


def words(prices: Prices, endpoint: Endpoint) -> str:
    """The endpoint's price rule as a customer reads it: "18 per profile", "30 per call", tiers by page size."""
    rule, unit = prices.rules[endpoint.price], _unit(endpoint)
    if "call" in rule:
        return f"{_n(max(prices.minimum, int(rule.get('minimum', 0)), math.ceil(rule['call'])))} per call"
    if "each" in rule:
        return f"{_n(rule['each'])} per {unit}"
    tiers = sorted(rule["tiers"], key=lambda tier: tier[0], reverse=True)  # the first FROM <= size applies
    parts = []
    for index, (start, price) in enumerate(tiers):
        amount = _n(price) if index else f"{_n(price)} per {unit}"
        if start > 0:
            parts.append(f"{amount} {_size_words(endpoint, start)}")
        else:
            parts.append(f"{amount} otherwise" if index else amount)
    return "; ".join(parts)


def _full_page(endpoint: Endpoint) -> int | None:
    """The page size of a call with the defaults (None: the number of ids sent decides)."""
    size = endpoint.size
    if size.fixed:
        return size.fixed
    return size.default or None


def row(prices: Prices, endpoint: Endpoint, terms: Terms, cache_ttl: dict) -> dict:
    least = prices.cost(endpoint.price, 0, _full_page(endpoint) or 1)
    page = _full_page(endpoint)
    fresh = ttl_of(endpoint.path, cache_ttl) if terms.cache_on and endpoint.available else 0
    return {
        "endpoint": endpoint.path,
        "available": endpoint.available,
        "price": words(prices, endpoint),
        "minimum": least,  # an empty page; every successful call costs at least this
        "page_size": page,
        "full_page": None if page is None else prices.cost(endpoint.price, page, page),
        "fresh_seconds": fresh,  # 0: every call is asked of the provider
    }


@functools.lru_cache(maxsize=8)
def sheet(terms: Terms) -> dict:
    """The price sheet of these terms (built once per terms)."""
    prices = Prices(orjson.loads(terms.price_rules))
    cache_ttl = orjson.loads(terms.cache_ttl)
    return {
        "credits_per_usd": terms.credits_per_usd,
        "minimum": prices.minimum,
        "cache_hit_price": terms.hit_price,
        "endpoints": [row(prices, e, terms, cache_ttl) for e in ENDPOINTS],
    }


def repeat_words(hit_price: float) -> str:
    """What an answer from the cache costs."""
    return "free" if hit_price == 0 else f"{_n(round(hit_price * 100, 2))} % of the price"


def description(entry: dict, hit_price: float) -> str:
    """A data operation's price and freshness, for the OpenAPI document (Markdown)."""
    if entry["full_page"] is None:
        page = "; the ids sent decide the most it can cost"
    elif entry["full_page"] == entry["minimum"]:
        page = ""  # the same price whatever comes back
    else:
        page = f"; a full page of {_n(entry['page_size'])}: {_n(entry['full_page'])}, what is reserved before the call"
    text = f"**Price** (credits): {entry['price']}; at least {_n(entry['minimum'])} a successful call{page}."
    if entry["fresh_seconds"]:
        text += (
            f" **Cache**: an answer stays fresh {_n(entry['fresh_seconds'])} s; a repeat within that is answered "
            f"from the cache ({repeat_words(hit_price)}, X-Cache: HIT)."
        )
    else:
        text += " **Cache**: off for this endpoint: every call is asked of the provider."
    return text
