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
    min_faves:N  min_retweets:N  min_replies:N
    filter:X / has:X with X in replies, media, images, links, quote, verified,
    hashtags, mentions

An unknown operator is matched as a plain word, which in practice finds nothing.
queryType Latest sorts newest first; Top sorts by World.engagement, newest first on ties.
"""

from __future__ import annotations

import calendar
import functools
import time
from collections.abc import Callable

from .basis import N_ACTIVE, words
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

    def add(self, pred: Pred) -> None:
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
        ws = words(text)
        if not ws:
            return lambda t: True
        needle, norm = f" {' '.join(ws)} ", self.w.norm_text()
        return lambda t: needle in norm[t.idx]

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
        if not sep or not value:
            return self.phrase(word)
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
            return (lambda t: t.ms >= ms) if key.startswith("since") else (lambda t: t.ms < ms)
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
        if key in ("filter", "has"):
            return self.feature(value.lower())
        return self.phrase(word)

    def feature(self, name: str) -> Pred:
        w = self.w
        features: dict[str, Pred] = {
            "replies": lambda t: t.parent >= 0,
            "media": lambda t: t.photos > 0,
            "images": lambda t: t.photos > 0,
            "links": lambda t: t.has_link,
            "quote": lambda t: t.quote >= 0,
            "verified": lambda t: w.is_blue(t.author),
            "blue_verified": lambda t: w.is_blue(t.author),
            "hashtags": lambda t: bool(t.tags),
            "mentions": lambda t: t.mention >= 0 or w.addressee(t) >= 0,
        }
        return features.get(name, lambda t: False)


class _From:
    """from:HANDLE, recognisable so that a top-level one narrows the scan to one author."""

    def __init__(self, user: int):
        self.user = user

    def __call__(self, t: Tweet) -> bool:
        return t.author == self.user


@functools.lru_cache(maxsize=256)
def search_tweets(w: World, query: str, query_type: str) -> list[int]:
    """Indices of the matching tweets in result order.  Raises QueryError."""
    preds = _Parser(w, query).parse()
    authors = [p.user for p in preds if isinstance(p, _From)]
    if authors:
        candidates = w.by_author[authors[0]] if 0 <= authors[0] < len(w.by_author) else ()  # lurkers never post
    else:
        candidates = range(len(w.tweets))
    tweets = w.tweets
    hits = [i for i in reversed(candidates) if all(p(tweets[i]) for p in preds)]
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
