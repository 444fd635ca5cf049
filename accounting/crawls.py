"""The crawl guard's memory: per crawl (an account paging through one query), which next cursor each cursor it
asked with was answered with. A provider whose cursor stops advancing (it answers the very cursor it was asked
for, or one the crawl already followed to another page) would otherwise be paid for the same pages for ever.
A re-read of a page (the same cursor answered with the same next cursor) is no loop."""

from collections import OrderedDict

CRAWLS = 10_000  # crawls remembered, the least recently paged forgotten first
PAGES = 1_000  # cursors remembered per crawl


class Crawls:
    def __init__(self, crawls: int = CRAWLS, pages: int = PAGES):
        self.limit, self.pages = crawls, pages
        self.seen: OrderedDict[tuple, dict[str, str]] = OrderedDict()

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
