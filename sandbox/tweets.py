"""The world's tweets: compact records made once in chronological order, their text composed on demand."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from .basis import END_S, N_ACTIVE, N_BIG, N_TWEETS, START_S, TWEPOCH_MS, VIEWS_SINCE_S, b62, h64, is_digits, words
from .phrases import CLOSERS, EXTRA_TAGS, LANG_INDEX, LANGS, LINK_TARGETS, OPENERS, TOPICS


@dataclass(slots=True)
class Tweet:
    """What search and paging need; the text itself is composed on demand (World.content)."""

    idx: int
    id: str
    author: int
    ms: int  # creation time, epoch milliseconds
    parent: int  # index of the tweet replied to, or -1
    quote: int  # index of the quoted tweet, or -1
    root: int  # index of the conversation root
    lang: str
    topic: int
    bits: int  # 128 random bits that fix the wording and the entities (see below)
    mention: int  # user mentioned in the body (besides a reply's addressee), or -1
    likes: int
    retweets: int
    bookmarks: int
    views: int | None
    community: int  # community index, or -1

    # bits 0-7 opener, 8-27 extra mention (decided at generation), 28-34 photos?,
    # 35-38 closer, 40-54 hashtags, 55-61 link?; bits 64+ are the hash that also gave the
    # id, language and topic: 104+ link target, 120-127 photo count.
    @property
    def tags(self) -> tuple[str, ...]:
        g = self.bits
        tags = (TOPICS[self.topic][0],) if (g >> 40 & 0x7F) % 100 < 35 else ()
        if (g >> 47 & 0xF) % 10 == 0:
            tags += (EXTRA_TAGS[(g >> 51 & 0xF) % len(EXTRA_TAGS)],)
        return tags

    @property
    def has_link(self) -> bool:
        return (self.bits >> 55 & 0x7F) % 100 < 15

    @property
    def photos(self) -> int:
        g = self.bits
        if (g >> 28 & 0x7F) % 100 >= 20:
            return 0
        return 1 if (g >> 124) % 10 < 7 else 2 + (g >> 120 & 0xF) % 3


@dataclass(frozen=True, slots=True)
class Content:
    text: str
    display: tuple[int, int]
    tags: tuple  # (tag, start, end)
    mentions: tuple  # (user index, start, end)
    link: tuple | None  # (start, end, t.co url, expanded url)
    media: tuple | None  # (start, end, t.co url)


class Tweets:
    """World's tweets and their indexes (mixed into World, which builds them after the users)."""

    def _make_tweets(self) -> None:
        # Hot loop (30,000 iterations): discrete choices come from the bits of one hash per
        # tweet and continuous ones from rng.random(), which is much cheaper than choice().
        rng, seed = self.rng, self.seed
        rand = rng.random
        activity = [60.0] * N_BIG + [rng.lognormvariate(0, 1.0) for _ in range(N_ACTIVE - N_BIG)]
        authors = rng.choices(range(N_ACTIVE), weights=activity, k=N_TWEETS)
        step = (END_S - START_S) * 1000 // N_TWEETS
        interests = [self.interests(u) for u in range(N_ACTIVE)]
        tweets: list[Tweet] = []
        self.tweets = tweets
        self.by_id: dict[str, int] = {}
        self.by_author: list[list[int]] = [[] for _ in range(N_ACTIVE)]
        self.replies: dict[int, list[int]] = {}
        self.quotes: dict[int, list[int]] = {}
        self.mentions: dict[int, list[int]] = {}
        self.virals: list[int] = []
        virals, recent_replies = self.virals, []
        for i in range(N_TWEETS):
            h, g = h64(seed, 6, i), h64(seed, 7, i)
            a = authors[i]
            ms = START_S * 1000 + i * step + int(rand() * step)
            parent = quote = -1
            r = rand()
            if i > 50 and r < 0.30:
                x = rand()
                if virals and x < 0.3:
                    parent = virals[-1 - int(rand() * min(3, len(virals)))]
                elif recent_replies and x < 0.55:
                    parent = recent_replies[-1 - int(rand() * min(40, len(recent_replies)))]
                else:
                    parent = i - 1 - int(rand() * min(i, 400))
                if rand() < 0.12:
                    a = tweets[parent].author  # the author continues their own thread
                recent_replies.append(i)
            elif i > 50 and r < 0.36:
                if virals and rand() < 0.5:
                    quote = virals[-1 - int(rand() * min(3, len(virals)))]
                else:
                    quote = i - 1 - int(rand() * min(i, 2000))
            main_lang, topics = interests[a]
            lang = main_lang if (h >> 22) % 10 else LANGS[(h >> 26) % len(LANGS)]
            topic = topics[(h >> 30) % 3] if (h >> 32) % 10 < 7 else (h >> 36) % len(TOPICS)
            viral = a < N_BIG and parent < 0 and rand() < 0.15
            mention = (g >> 16 & 0xFFF) % (N_BIG if (g >> 15) & 1 else N_ACTIVE)
            if (g >> 8 & 0x7F) % 100 >= 12 or mention == a:
                mention = -1
            base = 1500 if a < N_BIG else 6
            # Pareto(1.3) by inversion: heavy-tailed like real engagement.
            likes = int(base * ((1.0 - rand()) ** (-1 / 1.3) - 1) * (6 if viral else 1))
            tid = str(((ms - TWEPOCH_MS) << 22) | (h & 0x3FFFFF))
            tweets.append(
                Tweet(
                    idx=i,
                    id=tid,
                    author=a,
                    ms=ms,
                    parent=parent,
                    quote=quote,
                    root=tweets[parent].root if parent >= 0 else i,
                    lang=lang,
                    topic=topic,
                    bits=h << 64 | g,
                    mention=mention,
                    likes=likes,
                    retweets=int(likes * (0.05 + 0.3 * rand())),
                    bookmarks=int(likes * 0.12 * rand()),
                    views=None if ms < VIEWS_SINCE_S * 1000 else int((likes + 1) * (25 + 155 * rand())),
                    community=topic if parent < 0 and rand() < 0.1 else -1,
                )
            )
            self.by_id[tid] = i
            self.by_author[a].append(i)
            if parent >= 0:
                self.replies.setdefault(parent, []).append(i)
            if quote >= 0:
                self.quotes.setdefault(quote, []).append(i)
            for u in (self.addressee(tweets[i]), mention):
                if u >= 0:
                    self.mentions.setdefault(u, []).append(i)
            if viral:
                virals.append(i)

    def addressee(self, t: Tweet) -> int:
        """The user a reply opens with (@handle); -1 for posts and replies in one's own thread."""
        if t.parent < 0 or self.tweets[t.parent].author == t.author:
            return -1
        return self.tweets[t.parent].author

    def _body(self, t: Tweet) -> tuple[str, int, list, list]:
        """The words of a tweet before any URL: (text, display start, mentions, tags)."""
        g = t.bits
        text, mentions, tags = "", [], []
        pa = self.addressee(t)
        if pa >= 0:
            text = f"@{self.handles[pa]} "
            mentions.append((pa, 0, len(text) - 1))
        start = len(text)
        openers, closers = OPENERS[t.lang], CLOSERS[t.lang]
        text += f"{openers[(g & 0xFF) % len(openers)]} {TOPICS[t.topic][1 + LANG_INDEX[t.lang]]}"
        if t.mention >= 0:
            text += " with "
            mentions.append((t.mention, len(text), len(text) + 1 + len(self.handles[t.mention])))
            text += f"@{self.handles[t.mention]}"
        text += f" {closers[(g >> 35 & 0xF) % len(closers)]}"
        for tag in t.tags:
            text += " "
            tags.append((tag, len(text), len(text) + 1 + len(tag)))
            text += f"#{tag}"
        return text, start, mentions, tags

    @functools.lru_cache(maxsize=8192)
    def content(self, i: int) -> Content:
        """Text of tweet i with its entities (offsets in code points) and display range.
        Links and then the media link come last, as on the platform; the media link is
        outside the display range."""
        t, seed = self.tweet(i), self.seed
        text, start, mentions, tags = self._body(t)
        link = None
        if t.has_link:
            h = t.bits >> 64
            target = LINK_TARGETS[(h >> 40 & 0xF) % len(LINK_TARGETS)].format(
                s=self.handles[t.author].lower(), n=(h >> 44) % 99999, t=TOPICS[t.topic][0]
            )
            tco = f"https://t.co/{b62(h64(seed, 8, i), 10)}"
            text += " "
            link = (len(text), len(text) + len(tco), tco, f"https://{target}")
            text += tco
        end = len(text)
        media = None
        if t.photos:
            tco = f"https://t.co/{b62(h64(seed, 9, i), 10)}"
            text += " "
            media = (len(text), len(text) + len(tco), tco)
            text += tco
        return Content(text, (start, end), tuple(tags), tuple(mentions), link, media)

    def tweet_by_id(self, tid: str, now_s: int | None = None) -> int | None:
        """An archived tweet, or (given the time) a live post already made."""
        i = self.by_id.get(tid)
        if i is None and now_s is not None and is_digits(tid) and len(tid) < 25:
            return self.live_by_id(tid, now_s)
        return i

    def reply_count(self, i: int) -> int:
        return len(self.replies.get(i, ()))

    def quote_count(self, i: int) -> int:
        return len(self.quotes.get(i, ()))

    def statuses_count(self, u: int) -> int:
        return (len(self.by_author[u]) if u < N_ACTIVE else 0) + self.profile(u).extra_statuses

    def engagement(self, i: int) -> int:
        """The ranking score of advanced_search Top and replies/v2 Relevance."""
        t = self.tweet(i)
        return t.likes + 2 * t.retweets + self.reply_count(i) + self.quote_count(i)

    def ancestors(self, i: int) -> list[int]:
        out = []
        p = self.tweets[i].parent
        while p >= 0:
            out.append(p)
            p = self.tweets[p].parent
        out.reverse()
        return out

    def descendants(self, i: int) -> list[int]:
        """All replies below i, depth first, each level in chronological order."""
        out, stack = [], list(reversed(self.replies.get(i, ())))
        while stack:
            j = stack.pop()
            out.append(j)
            stack.extend(reversed(self.replies.get(j, ())))
        return out

    def norm_text(self) -> list[str]:
        """Lower-cased word sequences (space padded) for keyword and phrase search."""
        if self._norm is None:
            self._norm = [f" {' '.join(words(self._body(t)[0]))} " for t in self.tweets]
        return self._norm
