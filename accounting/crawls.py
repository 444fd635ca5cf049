"""The crawl guard's memory: per crawl (an account paging through one query), the pages it was served, each
as the cursor it was asked with and the next cursor it answered, within CRAWL_GUARD_MAX_BYTES per process.

The rule (docs/api.md, *The crawl guard*): a page ends its crawl when the provider's answer closes a cycle of
cursors, its next cursor being the cursor it was asked with or leading back to it through the next cursors of
pages this crawl was served. Only the provider's answers are remembered, so only a provider whose cursor stops
advancing can close one: an honest provider's cursors never do, in whatever order a customer asks its pages
(backward, skipping, with cursors known in advance). Such a page is free the first time this crawl is served
it; a page this crawl was served before is charged as any page (a re-read is no loop)."""

from collections import OrderedDict

PAGES = 1_000  # pages remembered per crawl, the earliest served forgotten first: bounds a cycle's walk
# Bytes a remembered crawl and a remembered page cost beyond their strings (objects, dict and set slots): counted
# in the bound, a little above what tracemalloc measured (CPython 3.11, short and 1,000-character strings).
CRAWL_OVERHEAD = 600
PAGE_OVERHEAD = 180


class _Crawl:
    __slots__ = ("steps", "ends", "bytes")

    def __init__(self, size: int):
        self.steps: dict[str, str] = {}  # cursor asked -> the next cursor its page answered ("": none)
        self.ends: set[str] = set()  # cursors whose page ended the crawl (kept answers of theirs are served so)
        self.bytes = size


class Crawls:
    def __init__(self, max_bytes: int, pages: int = PAGES):
        self.max_bytes, self.pages = max_bytes, pages
        self.seen: OrderedDict[tuple[str, str], _Crawl] = OrderedDict()
        self.bytes = 0

    def step(self, crawl: tuple[str, str], cursor: str, following: str) -> tuple[bool, bool]:
        """(ends, free) of the page asked with `cursor` (never the first page) that answered `following`: whether
        it closes a cycle of the crawl's cursors, and whether it does so on its first serving to this crawl.
        Remembers the page."""
        known = self.seen.get(crawl)
        if known is not None:
            self.seen.move_to_end(crawl)
        steps = known.steps if known is not None else {}
        served = cursor in steps
        ends = bool(following) and _closes(steps, cursor, following)
        self._remember(crawl, known, cursor, following, ends)
        return ends, ends and not served

    def ended(self, crawl: tuple[str, str], cursor: str) -> bool:
        """Whether the page asked with `cursor` ended this crawl when it was served (a kept answer of it, read
        again, is served without its next page too)."""
        known = self.seen.get(crawl)
        return known is not None and cursor in known.ends

    def _remember(self, crawl: tuple[str, str], known: _Crawl | None, cursor: str, following: str, ends: bool) -> None:
        if known is None:
            size = len(crawl[0]) + len(crawl[1]) + CRAWL_OVERHEAD
            if not self._room(size):
                return
            known = self.seen[crawl] = _Crawl(size)
            self.bytes += size
        steps = known.steps
        before = steps.get(cursor)
        if before is not None:  # served again: the page's latest next cursor
            grows = len(following) - len(before)
            if grows > 0 and not self._room(grows, keep=crawl):
                self._forget(known, cursor)
                return
            steps[cursor] = following
            self._resize(known, grows)
        else:
            if len(steps) >= self.pages:
                self._forget(known, next(iter(steps)))
            size = len(cursor) + len(following) + PAGE_OVERHEAD
            if not self._room(size, keep=crawl):
                return
            steps[cursor] = following
            self._resize(known, size)
        if ends:
            known.ends.add(cursor)
        else:
            known.ends.discard(cursor)

    def _room(self, size: int, keep: tuple[str, str] | None = None) -> bool:
        """Forgets the least recently paged crawls (never `keep`) until `size` more bytes fit the bound."""
        while self.bytes + size > self.max_bytes:
            oldest = next(iter(self.seen), None)
            if oldest is None or oldest == keep:
                return False  # larger than the bound alone: not remembered
            self.bytes -= self.seen.pop(oldest).bytes
        return True

    def _forget(self, known: _Crawl, cursor: str) -> None:
        following = known.steps.pop(cursor)
        known.ends.discard(cursor)
        self._resize(known, -(len(cursor) + len(following) + PAGE_OVERHEAD))

    def _resize(self, known: _Crawl, delta: int) -> None:
        known.bytes += delta
        self.bytes += delta


def _closes(steps: dict[str, str], cursor: str, following: str) -> bool:
    """Whether following the next cursors from `following` through the crawl's pages comes back to `cursor`."""
    for _ in range(len(steps) + 1):  # each remembered page at most once: a cycle elsewhere ends the walk
        if following == cursor:
            return True
        following = steps.get(following, "")
        if not following:
            return False
    return False
