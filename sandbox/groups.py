"""Lists, communities and spaces (groups of the world's users and their tweets), and trends."""

from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass

from .basis import END_S, N_ACTIVE, N_BIG, N_EMPTY_LISTS, N_LISTS, N_SPACES, N_TWEETS, START_S, b62, h64
from .phrases import TOPICS

RULES = (
    "Be kind and respectful",
    "Stay on topic",
    "No spam or self-promotion",
    "Credit original creators",
    "No hate speech",
    "Use content warnings",
    "English or translate your post",
    "No low-effort posts",
)
SPACE_TITLES = (
    "Ask me anything: {t}",
    "Weekly {t} hangout",
    "{t} — live Q&A",
    "Morning chat about {t}",
    "{t} news roundup",
)

WOEIDS = {
    1: "Worldwide",
    23424977: "United States",
    23424975: "United Kingdom",
    23424856: "Japan",
    23424950: "Spain",
    23424768: "Brazil",
    23424819: "France",
    23424829: "Germany",
    23424848: "India",
    2459115: "New York",
    44418: "London",
    1118370: "Tokyo",
}
TREND_PHRASES = (
    "Black Friday",
    "Champions League",
    "Super Bowl",
    "Election Night",
    "New Album",
    "Solar Eclipse",
    "Game Awards",
    "Heat Wave",
    "Transfer Window",
    "Product Launch",
    "Open Beta",
    "Monday Morning",
    "Season Finale",
    "World Cup",
    "Tech Layoffs",
)


@dataclass(slots=True)
class TweetList:
    id: str
    members: list[int]


@dataclass(slots=True)
class Community:
    id: str
    name: str
    description: str
    creator: int
    created_ms: int
    member_count: int
    moderator_count: int
    rules: list[tuple[str, str]]
    tweets: list[int]


@dataclass(slots=True)
class Space:
    id: str
    title: str
    creator: int
    admins: list[int]
    speakers: list[int]
    listeners: list[int]
    start_ms: int
    live_listeners: int
    replay_watched: int
    tweet: int


class Groups:
    """World's lists, communities, spaces and trends (mixed into World, which builds them after the tweets)."""

    def _make_lists(self) -> None:
        rng = self.rng
        empty = set(rng.sample(range(N_LISTS), N_EMPTY_LISTS))
        self.lists: list[TweetList] = []
        for k in range(N_LISTS):
            members = [] if k in empty else rng.sample(range(N_ACTIVE), rng.randrange(8, 60))
            lid = str(1_500_000_000_000_000_000 + h64(self.seed, 10, k) % 10**17)
            self.lists.append(TweetList(lid, members))
        self.list_by_id = {lst.id: k for k, lst in enumerate(self.lists)}

    def list_timeline(self, k: int) -> list[int]:
        if k not in self._list_timelines:
            items = [i for m in self.lists[k].members for i in self.by_author[m]]
            items.sort(reverse=True)
            self._list_timelines[k] = items
        return self._list_timelines[k]

    def _make_communities(self) -> None:
        rng = self.rng
        self.communities: list[Community] = []
        for c, topic in enumerate(TOPICS):
            phrase = topic[1]
            cid = str(1_600_000_000_000_000_000 + h64(self.seed, 11, c) % 10**17)
            self.communities.append(
                Community(
                    id=cid,
                    name=f"{phrase.title()} {('Builders', 'Club', 'Lovers', 'Hub')[c % 4]}",
                    description=f"A friendly place to share and discuss {phrase}. Newcomers welcome!",
                    creator=rng.randrange(N_ACTIVE),
                    created_ms=(START_S - rng.randrange(86400, 700 * 86400)) * 1000 + rng.randrange(1000),
                    member_count=int(rng.lognormvariate(8, 1.2)) + 50,
                    moderator_count=rng.randrange(1, 12),
                    rules=[
                        (r, str(1_700_000_000_000_000_000 + h64(self.seed, 12, c, n) % 10**17))
                        for n, r in enumerate(rng.sample(RULES, rng.randrange(2, 6)))
                    ],
                    tweets=[],
                )
            )
        for t in reversed(self.tweets):  # newest first
            if t.community >= 0:
                self.communities[t.community].tweets.append(t.idx)
        self.community_by_id = {c.id: k for k, c in enumerate(self.communities)}

    def _make_spaces(self) -> None:
        rng = self.rng
        self.spaces: list[Space] = []
        for s in range(N_SPACES):
            creator = s if s < N_BIG else rng.randrange(N_BIG, N_ACTIVE)
            people = rng.sample(range(N_BIG, N_ACTIVE), 40)
            listeners = people[10 : 10 + rng.randrange(0, 30)]
            own = self.by_author[creator]
            self.spaces.append(
                Space(
                    id="1" + b62(h64(self.seed, 13, s), 12),
                    title=rng.choice(SPACE_TITLES).format(t=TOPICS[rng.randrange(len(TOPICS))][1]),
                    creator=creator,
                    admins=[creator] + people[: rng.randrange(0, 3)],
                    speakers=people[3 : 3 + rng.randrange(0, 7)],
                    listeners=listeners,
                    start_ms=END_S * 1000 - rng.randrange(60_000, 3 * 3600_000),
                    live_listeners=len(listeners) + int(rng.lognormvariate(4, 1.5)),
                    replay_watched=rng.randrange(0, 500),
                    tweet=own[-1] if own else N_TWEETS - 1 - s,
                )
            )
        self.space_by_id = {sp.id: k for k, sp in enumerate(self.spaces)}

    # ---- trends ------------------------------------------------------------

    @functools.lru_cache(maxsize=64)
    def trends(self, woeid: int) -> list[tuple[str, int | None]]:
        """(name, tweet_volume) ranked for a WOEID: recent hashtag counts, regionally jittered."""
        counts: dict[str, float] = {}
        for t in self.tweets[-3000:]:
            for tag in t.tags:
                counts["#" + tag] = counts.get("#" + tag, 0) + 1
        for n, phrase in enumerate(TREND_PHRASES):
            counts[phrase] = 5 + h64(self.seed, 14, n) % 40
        for n, topic in enumerate(TOPICS):
            counts[topic[1].title()] = 3 + h64(self.seed, 15, n) % 30
        ranked = sorted(
            counts, key=lambda k: (-counts[k] * (1 + h64(self.seed, woeid, zlib.crc32(k.encode())) % 100 / 50), k)
        )
        return [
            (name, None if h64(self.seed, 16, woeid, n) % 3 else int(counts[name] * 1000 + n))
            for n, name in enumerate(ranked)
        ]
