"""The shared answer cache's in-process tier: what a data call's answer is keyed by, how long it stays fresh
per endpoint, and the answers themselves, bounded in bytes with the least recently used evicted first.

The provider's answers are public data, the same for every customer, so the key holds only what reaches the
provider: its path and the forwarded query, normalized (`answer_key`). The customer's API key and
Idempotency-Key never take part. The second tier, shared by processes and machines, is storage/answers.py;
accounting/charged.py decides when either is read or written.
"""

import time
from collections import OrderedDict

from social.query import normalized_query
from storage.answers import Cached

# Seconds an answer stays fresh, by endpoint path as under /social/ (CACHE_TTL overrides, 0 turns one off):
# profiles and other slow-moving objects longer, follow lists in between, searches and timelines shorter.
DEFAULT_TTL = {
    "user/info": 900,
    "user_about": 900,
    "user/batch_info_by_ids": 900,
    "community/info": 900,
    "article": 900,
    "spaces/detail": 300,
    "user/check_follow_relationship": 600,
    "tweets": 600,
    "user/followers": 600,
    "user/followings": 600,
    "user/followers_ids": 600,
    "user/verifiedFollowers": 600,
    "list/followers": 600,
    "list/members": 600,
    "community/members": 600,
    "tweet/retweeters": 300,
    "user/search": 300,
    "trends": 300,
    "tweet/advanced_search": 120,
    "user/tweet_timeline": 120,
    "user/last_tweets": 120,
    "user/mentions": 120,
    "community/tweets": 120,
    "list/tweets_timeline": 120,
    "tweet/thread_context": 120,
    "tweet/replies": 120,
    "tweet/replies/v2": 120,
    "tweet/quotes": 120,
}
OVERHEAD = 300  # bytes an entry costs beyond its body and key (the entry, the dict slot): counted in the bound
# and an eighth of the body more: what the allocator holds around bodies kept among short-lived ones (measured with
# bench/cache.py --memory: without it, RSS grew 13 % past the bytes counted)


def answer_key(path: str, query: str) -> str:
    """The cache key of a call: the provider path and its forwarded query in its normal form (social/query.py,
    as an Idempotency-Key's repeat is recognised): parameter order and percent encoding do not matter, every
    forwarded parameter does, the cursor too."""
    return path + "?" + normalized_query(query)


def ttl_of(path: str, overrides: dict) -> int:
    """Freshness in seconds of an endpoint (`path` as in the endpoint table, with its leading /)."""
    name = path.lstrip("/")
    return int(overrides.get(name, DEFAULT_TTL.get(name, 0)))


class AnswerCache:
    """Answers by key, at most `max_bytes` in all (0: nothing is kept). An entry is kept until it is older
    than `keep` seconds (its freshness window or the stale-if-error window, whichever is longer) or evicted;
    freshness itself is the reader's decision (accounting/charged.py), so one entry serves both."""

    def __init__(self, max_bytes: int, keep: float, clock=time.time):
        self.max_bytes, self.keep, self.clock = max_bytes, keep, clock
        self.entries: OrderedDict[str, Cached] = OrderedDict()
        self.bytes = 0

    def get(self, key: str) -> Cached | None:
        entry = self.entries.get(key)
        if entry is None:
            return None
        if entry.age(self.clock()) > self.keep:
            self._drop(key)
            return None
        self.entries.move_to_end(key)
        return entry

    def put(self, key: str, entry: Cached) -> None:
        size = _size(key, entry)
        if size > self.max_bytes:
            return  # never kept: a cache turned off (0), or one answer larger than the whole bound
        if key in self.entries:
            self._drop(key)
        self.entries[key] = entry
        self.bytes += size
        while self.bytes > self.max_bytes:
            self._drop(next(iter(self.entries)))

    def drop(self, key: str) -> None:
        if key in self.entries:
            self._drop(key)

    def _drop(self, key: str) -> None:
        entry = self.entries.pop(key)
        self.bytes -= _size(key, entry)


def _size(key: str, entry: Cached) -> int:
    return len(entry.body) + len(entry.body) // 8 + len(key) + OVERHEAD
