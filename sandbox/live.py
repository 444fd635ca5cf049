"""The sandbox in motion: posts that appear as wall-clock time passes.

Every second since the archive ends (END_S) holds one to three *live* posts, each a pure
function of (seed, second, slot): any sandbox process, restarted or not, finds the same
posts at the same second, so two gateway workers polling two sandboxes agree.  Nothing is
stored; a second's posts are made when first asked for and kept in a small LRU.

* Slot 0 of every second is by one of the four LIVE_CORE users, in turn (each posts every
  4 seconds, in English, so `lang:en` and their `user/last_tweets` gain a post at least
  every 4 seconds); slots 1 and 2 are by one of the most active users, in their language.
* Ids are snowflakes of the creation time, so they grow with time (since_id works) and
  decode back to their second: a live post is found by id at any age.
* Lists (search, timelines, mentions) show the live posts of the hour before the request
  (or before the time a cursor was issued, so paging a moving list never repeats a post).
* A live post is an original post (not a reply or a quote); its index in World.tweet is
  N_TWEETS + (second - END_S) * SLOTS + slot.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator

from .basis import END_S, N_ACTIVE, N_BIG, N_TWEETS, TWEPOCH_MS, h64, words
from .phrases import LANGS, TOPICS
from .tweets import Tweet

SLOTS = 4  # index space per second (at most 3 are used)
WINDOW_S = 3600  # how far back lists show live posts
N_POSTERS = 300  # the most active ordinary users post live, besides the big accounts
LIVE_START_S = END_S


class Live:
    """World's live posts (mixed into World; _make_live runs after the tweets exist)."""

    def _make_live(self) -> None:
        ordinary = sorted(range(N_BIG, N_ACTIVE), key=lambda u: (-len(self.by_author[u]), u))
        # The three most active ordinary users (the catalog's first) and the first big account.
        self.live_core: tuple[int, ...] = (*ordinary[:3], 0)
        self.live_posters: tuple[int, ...] = tuple(range(N_BIG)) + tuple(ordinary[:N_POSTERS])
        self.live_poster_set = frozenset(self.live_posters)

    def tweet(self, i: int) -> Tweet:
        """Tweet record i, archived or live."""
        return self.tweets[i] if i < N_TWEETS else self.live_second(LIVE_START_S + (i - N_TWEETS) // SLOTS)[i % SLOTS]

    @functools.lru_cache(maxsize=3 * WINDOW_S)  # noqa: B019 - worlds live as long as the process
    def live_second(self, s: int) -> tuple[Tweet, ...]:
        """The live posts of second s (UTC unix seconds), oldest first."""
        seed = self.seed
        n = 1 + h64(seed, 40, s) % 3
        out = []
        for j in range(n):
            h, g = h64(seed, 41, s, j), h64(seed, 42, s, j)
            if j == 0:
                author, lang = self.live_core[s % len(self.live_core)], "en"
            else:
                author = self.live_posters[h % len(self.live_posters)]
                main = self.interests(author)[0]
                lang = main if (h >> 22) % 10 else LANGS[(h >> 26) % len(LANGS)]
            topics = self.interests(author)[1]
            topic = topics[(h >> 30) % 3] if (h >> 32) % 10 < 7 else (h >> 36) % len(TOPICS)
            mention = self.live_posters[(g >> 16 & 0xFFF) % len(self.live_posters)]
            if (g >> 8 & 0x7F) % 100 >= 12 or mention == author:
                mention = -1
            ms = s * 1000 + j * 250 + (h >> 40) % 250  # slots in order: ids grow within the second too
            # Young posts: few likes yet (a Pareto tail from the hash's top bits).
            likes = int(4 * ((1.0 - ((h >> 44) & 0xFFFFF) / 2**20) ** (-1 / 1.3) - 1))
            idx = N_TWEETS + (s - LIVE_START_S) * SLOTS + j
            out.append(
                Tweet(
                    idx=idx,
                    id=str(((ms - TWEPOCH_MS) << 22) | (h & 0x3FFFFF)),
                    author=author,
                    ms=ms,
                    parent=-1,
                    quote=-1,
                    root=idx,
                    lang=lang,
                    topic=topic,
                    bits=h << 64 | g,
                    mention=mention,
                    likes=likes,
                    retweets=likes // 5,
                    bookmarks=likes // 9,
                    views=(likes + 1) * (20 + g % 60),
                    community=-1,
                )
            )
        return tuple(out)

    def live_by_id(self, tid: str, now_s: int) -> int | None:
        """The index of a live post, found from the time its id encodes; None once past now_s."""
        ms = (int(tid) >> 22) + TWEPOCH_MS
        s = ms // 1000
        if not LIVE_START_S <= s <= now_s:
            return None
        for t in self.live_second(s):
            if t.id == tid:
                return t.idx
        return None

    def live_scan(self, asof: int, lo_ms: int = 0, hi_ms: int | None = None) -> Iterator[Tweet]:
        """Live posts listed at time asof (its last WINDOW_S seconds), newest first, within
        [lo_ms, hi_ms) when given (the bounds only narrow the seconds scanned)."""
        top = asof if hi_ms is None else min(asof, (hi_ms - 1) // 1000)
        bottom = max(asof - WINDOW_S + 1, LIVE_START_S, lo_ms // 1000)
        second = self.live_second
        for s in range(top, bottom - 1, -1):
            yield from reversed(second(s))

    def live_where(self, asof: int, keep: Callable[[Tweet], bool]) -> list[int]:
        return [t.idx for t in self.live_scan(asof) if keep(t)]

    @functools.lru_cache(maxsize=8192)  # noqa: B019
    def live_norm(self, i: int) -> str:
        """Lower-cased words of live post i (space padded), as norm_text has for the archive."""
        return f" {' '.join(words(self._body(self.tweet(i))[0]))} "
