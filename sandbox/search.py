"""advanced_search's query language, and user search, over the synthetic corpus.

Grammar (as on the platform, OR binds tighter than the implicit AND):

    query  := group+                      all groups must match
    group  := unary ("OR" unary)*        any alternative may match
    unary  := "-" unary | "(" query ")" | atom
    atom   := "quoted phrase" | operator:value | #hashtag | @handle | word

Words and phrases match whole words, case-insensitively, in the text outside URLs
(a hashtag's word counts, so `coffee` finds `#Coffee`).  Operators:

    from:HANDLE  to:HANDLE (replies to)  lang:CODE  conversation_id:ID
    since:YYYY-MM-DD  until:YYYY-MM-DD   (also YYYY-MM-DD_HH:MM:SS_UTC; until is exclusive)
    since_time:UNIX  until_time:UNIX     (seconds; until_time is exclusive)
    since_id:ID  max_id:ID               (ids above since_id; ids up to max_id)
    min_faves:N  min_retweets:N  min_replies:N
    within_time:Nd|Nh|Nm|Ns              (the last N days, hours, minutes or seconds: see absolute)
    filter:X / has:X, and exclude:X (= -filter:X), with X in replies, self_threads, media, images,
    twimg, links, quote, retweets (quotes: the world has no "RT" posts), verified,
    blue_verified, hashtags, mentions, has_engagement, safe (every post: none is sensitive),
    nativeretweets, videos, native_video, consumer_video, pro_video, vine, periscope,
    spaces, news (none: the world has no reposts, videos or news links)
    quoted_tweet_id:ID  quoted_user_id:ID  list:ID  url:TEXT  source:CLIENT
    card_name: card_domain: card_url: (none: no post carries a card)
    +word (the word as it is)  "a phrase with * a wildcard" (one word)

The provider's other operators (github.com/igorbrigadir/twitter-advanced-search, which its docs
link) are accepted and ignored, as if absent from the query, where they mean nothing in this
world: include:nativeretweets (no reposts to include), filter:follows/social/trusted (there is no
searcher), near:, within:, geocode:, place: (no post has a place). An unknown operator is matched
as a plain word, which in practice finds nothing.
queryType Latest sorts newest first; Top sorts by World.engagement, newest first on ties.

The corpus is the archive plus the live posts listed at the request's time (sandbox.live).
Time and id bounds at the top level narrow what is scanned: a poll for what is new since a
recent time or id never looks at the archive.
"""

from __future__ import annotations

import calendar
import functools
import re
import time
from collections.abc import Callable

from .basis import N_ACTIVE, N_TWEETS, TWEPOCH_MS, is_digits, words
from .live import LIVE_START_S
from .render import source
from .tweets import Tweet
from .world import World

Pred = Callable[[Tweet], bool]


class QueryError(ValueError):
    pass


def _tokens(query: str) -> list[tuple[str, str]]:
    out, i, n = [], 0, len(query)
    while i < n:
        ch = query[i]
        if ch.isspace():
            i += 1
        elif ch in "()":
            out.append((ch, ch))
            i += 1
        elif ch == "-" and i + 1 < n and not query[i + 1].isspace():
            out.append(("-", ch))
            i += 1
        elif ch == '"':
            end = query.find('"', i + 1)
            end = n if end < 0 else end
            out.append(("phrase", query[i + 1 : end]))
            i = end + 1
        else:
            j = i
            while j < n and not query[j].isspace() and query[j] not in '()"':
                j += 1
            word = query[i:j]
            out.append(("OR", word) if word == "OR" else ("word", word))
            i = j
    return out


def _date(value: str) -> int:
    for fmt in ("%Y-%m-%d", "%Y-%m-%d_%H:%M:%S_UTC"):
        try:
            return calendar.timegm(time.strptime(value, fmt))
        except ValueError:
            pass
    raise QueryError(f"bad date: {value}")


def _int(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise QueryError(f"bad number: {value}") from None


MAX_QUERY_LENGTH = 1000  # characters; what the gateway accepts for a string parameter
MAX_DEPTH = 16  # nested parentheses
MAX_TERMS = 64  # words, phrases and operators: each is checked against every candidate tweet


IGNORED = None  # what atom() gives for an operator that means nothing in this world
IGNORED_OPERATORS = frozenset(("include", "near", "within", "geocode", "place"))
SEARCHER_FILTERS = frozenset(("follows", "social", "trusted"))  # about who searches: there is nobody
NEVER = frozenset(
    ("nativeretweets", "videos", "native_video", "consumer_video", "pro_video", "vine", "periscope", "spaces", "news")
)
_WITHIN = re.compile(r"(?<!\S)within_time:(\d{1,9})([dhms])(?!\S)", re.I)
_UNIT_S = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def absolute(query: str, now_s: int) -> str:
    """within_time:N<unit> as the since_time: it means at `now_s` (the request's time, or its first page's):
    the parsed query then depends on the text alone and is cached as any other."""
    return _WITHIN.sub(lambda m: f"since_time:{now_s - int(m.group(1)) * _UNIT_S[m.group(2).lower()]}", query)


def _all(preds: list[Pred]) -> Pred:
    return preds[0] if len(preds) == 1 else (lambda t: all(p(t) for p in preds))


def _any(preds: list[Pred]) -> Pred:
    return preds[0] if len(preds) == 1 else (lambda t: any(p(t) for p in preds))


def _negated(pred: Pred, negations: int) -> Pred:
    # A chain of minus signs is its parity: `---x` is `-x`, never a tower of nested closures.
    return (lambda t: not pred(t)) if negations % 2 else pred


class _Frame:
    """One parenthesised query (or the whole one) being read: its AND list of OR groups."""

    def __init__(self, negations: int = 0, joins_or: bool = False):
        self.groups: list[list[Pred]] = []  # each inner list: the alternatives of one group
        self.negations = 0  # minus signs read before the next unary
        self.joins_or = False  # an OR was read: the next unary is one more alternative of the last group
        self.outer = (negations, joins_or)  # the parent's pending state, applied when this frame closes

    def add(self, pred: Pred | None) -> None:
        if pred is IGNORED:  # as if the term were not there: a minus sign before it goes with it
            self.negations = 0
            return
        pred = _negated(pred, self.negations)
        if self.joins_or and self.groups:
            self.groups[-1].append(pred)
        else:
            self.groups.append([pred])
        self.negations, self.joins_or = 0, False

    def result(self) -> list[Pred]:
        if self.negations:  # a trailing minus sign negates nothing: it matches everything
            self.negations = 0
            self.add(lambda t: True)
        return [_any(alts) for alts in self.groups]


class _Parser:
    """Reads the query in one pass with an explicit stack: no recursion, so no input can exhaust it.

    Beyond MAX_QUERY_LENGTH characters, MAX_DEPTH nested parentheses or MAX_TERMS terms the query
    is refused (QueryError, answered 400) before any tweet is looked at."""

    def __init__(self, w: World, query: str):
        if len(query) > MAX_QUERY_LENGTH:
            raise QueryError(f"query is longer than {MAX_QUERY_LENGTH} characters")
        self.w = w
        self.toks = _tokens(query)

    def parse(self) -> list[Pred]:
        """The top-level AND list (kept as a list so the caller can narrow candidates)."""
        stack, terms = [_Frame()], 0
        for kind, value in self.toks:
            frame = stack[-1]
            if kind == "-":
                frame.negations += 1
            elif kind == "(":
                if len(stack) > MAX_DEPTH:
                    raise QueryError(f"more than {MAX_DEPTH} nested parentheses")
                stack.append(_Frame(frame.negations, frame.joins_or))
                frame.negations, frame.joins_or = 0, False
            elif kind == ")":
                if len(stack) == 1:
                    continue  # a stray closing parenthesis is ignored
                self._close(stack)
            elif kind == "OR" and frame.groups and not frame.joins_or and not frame.negations:
                frame.joins_or = True
            else:
                terms += 1
                if terms > MAX_TERMS:
                    raise QueryError(f"more than {MAX_TERMS} search terms")
                frame.add(self.phrase(value) if kind == "phrase" else self.atom(value))
        while len(stack) > 1:  # unclosed parentheses close at the end
            self._close(stack)
        return stack[0].result()

    @staticmethod
    def _close(stack: list[_Frame]) -> None:
        inner = stack.pop()
        parent = stack[-1]
        parent.negations, parent.joins_or = inner.outer
        preds = inner.result()
        parent.add(_all(preds) if preds else (lambda t: True))

    def phrase(self, text: str) -> Pred:
        norm, live = self.w.norm_text(), self.w.live_norm
        if "*" in text.split():  # a wildcard stands for one word
            parts = [r"\S+" if tok == "*" else re.escape(" ".join(words(tok))) for tok in text.split()]
            pattern = re.compile(" " + " ".join(part for part in parts if part) + " ")
            return lambda t: pattern.search(norm[t.idx] if t.idx < N_TWEETS else live(t.idx)) is not None
        ws = words(text)
        if not ws:
            return lambda t: True
        needle = f" {' '.join(ws)} "
        return lambda t: needle in (norm[t.idx] if t.idx < N_TWEETS else live(t.idx))

    def atom(self, word: str) -> Pred:
        w = self.w
        key, sep, value = word.partition(":")
        key = key.lower()
        if word.startswith("#") and len(word) > 1:
            tag = word[1:].lower()
            return lambda t: any(x.lower() == tag for x in t.tags)
        if word.startswith("@") and len(word) > 1:
            u = w.user_by_handle(word[1:])
            return lambda t: u is not None and u in (t.mention, w.addressee(t))
        if word.startswith("+") and len(word) > 1:
            return self.phrase(word[1:])
        if not sep or not value:
            return self.phrase(word)
        if key in IGNORED_OPERATORS:
            return IGNORED
        if key in ("from", "to"):
            u = w.user_by_handle(value)
            if u is None:
                return lambda t: False
            if key == "from":
                return _From(u)
            return lambda t: t.parent >= 0 and w.tweets[t.parent].author == u
        if key == "lang":
            lang = value.lower()
            return lambda t: t.lang == lang
        if key in ("since", "until", "since_time", "until_time"):
            ms = 1000 * (_date(value) if key in ("since", "until") else _int(value))
            return _Bound(lo=ms) if key.startswith("since") else _Bound(hi=ms)
        if key in ("since_id", "max_id"):
            if not is_digits(value) or len(value) > 20:
                raise QueryError(f"bad id: {value}")
            n = int(value)
            ms = (n >> 22) + TWEPOCH_MS  # the time a snowflake id encodes
            return _Bound(lo=ms, above=n) if key == "since_id" else _Bound(hi=ms + 1, upto=n)
        if key == "min_faves":
            n = _int(value)
            return lambda t: t.likes >= n
        if key == "min_retweets":
            n = _int(value)
            return lambda t: t.retweets >= n
        if key == "min_replies":
            n = _int(value)
            return lambda t: w.reply_count(t.idx) >= n
        if key == "conversation_id":
            root = w.tweet_by_id(value)
            return lambda t: root is not None and t.root == root
        if key in ("filter", "has", "exclude"):
            feature = self.feature(value.lower())
            return feature if key != "exclude" or feature is IGNORED else (lambda t: not feature(t))
        if key == "quoted_tweet_id":
            quoted = w.tweet_by_id(value)
            return lambda t: quoted is not None and t.quote == quoted
        if key == "quoted_user_id":
            u = w.user_by_id(value)
            return lambda t: u is not None and t.quote >= 0 and w.tweet(t.quote).author == u
        if key == "list":
            k = w.list_by_id.get(value)
            members = frozenset(w.lists[k].members) if k is not None else frozenset()
            return lambda t: t.author in members
        if key == "url":  # as on the platform, _ stands for - (and matches either)
            needle = value.lower().replace("_", "-")
            return lambda t: t.has_link and needle in w.content(t.idx).link[3].lower().replace("_", "-")
        if key == "source":  # _ for the spaces of a client's name
            client = value.lower().replace("_", " ")
            return lambda t: source(w, t.idx).lower() == client
        if key in ("card_name", "card_domain", "card_url"):
            return lambda t: False
        return self.phrase(word)

    def feature(self, name: str) -> Pred | None:
        w = self.w
        if name in SEARCHER_FILTERS:
            return IGNORED
        if name in NEVER:
            return lambda t: False
        features: dict[str, Pred] = {
            "replies": lambda t: t.parent >= 0,
            "self_threads": lambda t: t.parent >= 0 and w.tweet(t.parent).author == t.author,
            "media": lambda t: t.photos > 0,
            "images": lambda t: t.photos > 0,
            "twimg": lambda t: t.photos > 0,
            "links": lambda t: t.has_link,
            "quote": lambda t: t.quote >= 0,
            "retweets": lambda t: t.quote >= 0,
            "verified": lambda t: w.is_blue(t.author),
            "blue_verified": lambda t: w.is_blue(t.author),
            "hashtags": lambda t: bool(t.tags),
            "mentions": lambda t: t.mention >= 0 or w.addressee(t) >= 0,
            "has_engagement": lambda t: t.likes > 0 or t.retweets > 0 or w.reply_count(t.idx) > 0,
            "safe": lambda t: True,
        }
        return features.get(name, lambda t: False)


class _Bound:
    """A time or id bound, recognisable so that top-level ones narrow the scan: [lo, hi) in
    epoch ms, and for since_id / max_id the exact id comparison."""

    def __init__(self, lo: int = 0, hi: int | None = None, above: int | None = None, upto: int | None = None):
        self.lo, self.hi, self.above, self.upto = lo, hi, above, upto

    def __call__(self, t: Tweet) -> bool:
        if t.ms < self.lo or (self.hi is not None and t.ms >= self.hi):
            return False
        if self.above is not None and int(t.id) <= self.above:
            return False
        return self.upto is None or int(t.id) <= self.upto


class _From:
    """from:HANDLE, recognisable so that a top-level one narrows the scan to one author."""

    def __init__(self, user: int):
        self.user = user

    def __call__(self, t: Tweet) -> bool:
        return t.author == self.user


class Query:
    """A parsed query: its top-level predicates, the author and time range they narrow to."""

    def __init__(self, w: World, query: str):
        self.preds = _Parser(w, query).parse()
        authors = [p.user for p in self.preds if isinstance(p, _From)]
        self.author = authors[0] if authors else None
        bounds = [p for p in self.preds if isinstance(p, _Bound)]
        self.lo_ms = max((b.lo for b in bounds), default=0)
        his = [b.hi for b in bounds if b.hi is not None]
        self.hi_ms = min(his) if his else None

    def match(self, t: Tweet) -> bool:
        return all(p(t) for p in self.preds)


@functools.lru_cache(maxsize=1024)
def parse(w: World, query: str) -> Query:
    """Raises QueryError."""
    return Query(w, query)


@functools.lru_cache(maxsize=256)
def search_tweets(w: World, query: str, query_type: str) -> list[int]:
    """Indices of the matching archived tweets in result order.  Raises QueryError."""
    q = parse(w, query)
    if q.lo_ms > w.tweets[-1].ms:
        return []  # asks only for what is newer than the archive
    if q.author is not None:
        candidates = w.by_author[q.author] if 0 <= q.author < len(w.by_author) else ()  # lurkers never post
    else:
        candidates = range(len(w.tweets))
    tweets, preds = w.tweets, q.preds
    hits = [i for i in reversed(candidates) if all(p(tweets[i]) for p in preds)]
    if query_type == "Top":
        hits.sort(key=lambda i: (w.engagement(i), i), reverse=True)
    return hits


def moves(w: World, query: str) -> bool:
    """Whether live posts can match: not when the query ends before they begin or names an
    author who never posts live (such a result stays the same, cursors included)."""
    q = parse(w, query)
    if q.hi_ms is not None and q.hi_ms <= LIVE_START_S * 1000:
        return False
    return q.author is None or q.author in w.live_poster_set


def search_live(w: World, query: str, query_type: str, asof: int) -> list[int]:
    """Indices of the matching live posts listed at time asof, in result order."""
    q = parse(w, query)
    if not moves(w, query):
        return []
    hits = [t.idx for t in w.live_scan(asof, q.lo_ms, q.hi_ms) if q.match(t)]
    if query_type == "Top":
        hits.sort(key=lambda i: (w.engagement(i), i), reverse=True)
    return hits


@functools.lru_cache(maxsize=256)
def search_users(w: World, query: str) -> list[int]:
    """Active users whose handle, name or bio contain every query word, best match first:
    exact handle, handle prefix, whole word of the name, then anywhere; ties by followers."""
    terms = words(query)
    if not terms:
        return []
    scored = []
    for u in range(N_ACTIVE):
        handle, name = w.handles[u].lower(), w.names[u].lower()
        name_words = words(name)
        bio = w.profile(u).description.lower()
        score = 0
        for term in terms:
            if term == handle:
                score += 100
            elif handle.startswith(term):
                score += 40
            elif term in name_words:
                score += 30
            elif term in handle or term in name:
                score += 10
            elif term in bio:
                score += 5
            else:
                break
        else:
            scored.append((score, len(w.followers(u)), -u))
    scored.sort(reverse=True)
    return [-u for _, _, u in scored]
