"""The crawl guard's memory: per crawl (an account paging through one query), which next cursor each cursor it
asked with was answered with. A provider whose cursor stops advancing (it answers the very cursor it was asked
for, or one the crawl already followed to another page) would otherwise be paid for the same pages for ever.
A re-read of a page (the same cursor answered with the same next cursor) is no loop."""

from collections import OrderedDict

import orjson

from social.answer_cache import answer_key

CRAWLS = 10_000  # crawls remembered, the least recently paged forgotten first
PAGES = 1_000  # cursors remembered per crawl


class Crawls:
    def __init__(self, crawls: int = CRAWLS, pages: int = PAGES):
        self.limit, self.pages = crawls, pages
        self.seen: OrderedDict[tuple, dict[str, str]] = OrderedDict()

    def guard(self, account: str, path: str, query: str, cursor: str, body: bytes) -> bytes | None:
        """The page `body` (asked with `cursor`) ended, with no next page, when it loops in the account's crawl of
        `query` (its cursor aside); None when it does not."""
        try:
            page = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(page, dict):
            return None
        crawl = (account, answer_key(path, _without_cursor(query)))
        if not self.repeats(crawl, cursor, _following(page)):
            return None
        page["has_next_page"], page["next_cursor"] = False, ""
        return orjson.dumps(page)

    def repeats(self, crawl: tuple, cursor: str, following: str) -> bool:
        """True when the page asked with `cursor` (""): the first page) answering `following` as its next
        cursor loops; remembers the step otherwise."""
        steps = self.seen.get(crawl)
        if steps is None:
            steps = self.seen[crawl] = {}
            if len(self.seen) > self.limit:
                self.seen.popitem(last=False)
        else:
            self.seen.move_to_end(crawl)
        if not following:
            return False
        if following == cursor or (following in steps and steps.get(cursor) != following):
            return True
        if len(steps) < self.pages:
            steps[cursor] = following
        return False


def repeats_itself(body: bytes, cursor: str | None) -> bool:
    """A page whose next cursor is the one it was asked with: a loop whoever crawls (the owner worker, keeping an
    answer as it lands, does not keep it)."""
    if not cursor:
        return False
    try:
        page = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    return isinstance(page, dict) and _following(page) == cursor


def _following(page: dict) -> str:
    following = page.get("next_cursor") if page.get("has_next_page") else ""
    return str(following) if following not in (None, "") else ""


def _without_cursor(query: str) -> str:
    return "&".join(part for part in query.split("&") if not part.startswith("cursor="))
