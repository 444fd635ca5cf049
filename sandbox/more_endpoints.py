"""The six endpoints beyond the spec, from the provider's current documentation: tweet/retweeters,
list/followers, list/members, community/members, user/check_follow_relationship and article.

Long member lists cost nothing to store: like a big account's lurker followers (users.Followers),
they are affine sequences over the user index range, `(offset + k * stride) % N_USERS` with the
stride coprime to N_USERS, so every user appears at most once and any page is a few multiplications.

* retweeters: as many as the post's retweetCount, 100 a page (the provider's "about 100").
* list followers: 10–600 a list (empty lists too have followers); list members: the list's members.
* community members: the community's member_count, capped at the world's 60,000 users.
* articles: about one original post in six by a blue-verified author carries an article
  (catalog `articles`); any other post answers status "error", "article not found".
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

from . import render
from .args import USER_PAGE, Args, NotFound, lookup, tweet_arg, user_arg, users_page
from .basis import N_USERS, b62, h64
from .phrases import CLOSERS, OPENERS, TOPICS
from .world import World

RETWEETER_PAGE = 100


class Affine:
    """n distinct user indices: (offset + k * stride) % N_USERS for k < n."""

    __slots__ = ("n", "offset", "stride")

    def __init__(self, n: int, h: int):
        self.n, self.offset = min(n, N_USERS), h % N_USERS
        stride = 1 + (h >> 20) % (N_USERS - 1)
        while math.gcd(stride, N_USERS) != 1:
            stride += 1
        self.stride = stride

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, s: slice) -> list[int]:
        start, stop, _ = s.indices(self.n)
        return [(self.offset + k * self.stride) % N_USERS for k in range(start, stop)]


def retweeters(w: World, a: Args) -> dict:
    i = tweet_arg(w, a)
    people: Sequence[int] = Affine(w.tweet(i).retweets, h64(w.seed, 50, i))
    return users_page(w, a, people, RETWEETER_PAGE)


def list_followers(w: World, a: Args) -> dict:
    k = lookup(w.list_by_id, a.require("list_id"), "list")
    return users_page(w, a, Affine(10 + h64(w.seed, 51, k) % 590, h64(w.seed, 52, k)), USER_PAGE)


def list_members(w: World, a: Args) -> dict:
    k = lookup(w.list_by_id, a.require("list_id"), "list")
    return users_page(w, a, w.lists[k].members, USER_PAGE)


def community_members(w: World, a: Args) -> dict:
    c = lookup(w.community_by_id, a.require("community_id"), "community")
    com = w.communities[c]
    return users_page(w, a, Affine(com.member_count, h64(w.seed, 53, c)), USER_PAGE)


def check_follow_relationship(w: World, a: Args) -> dict:
    source = user_arg(w, a, by_name="source_user_name")
    target = user_arg(w, a, by_name="target_user_name")
    return {"data": {"following": target in w.following(source), "followed_by": source in w.following(target)}}


@functools.lru_cache(maxsize=4)
def article_tweets(w: World) -> list[int]:
    """Archived posts that carry an article, oldest first."""
    return [
        t.idx
        for t in w.tweets
        if t.parent < 0 and t.quote < 0 and w.is_blue(t.author) and h64(w.seed, 54, t.idx) % 6 == 0
    ]


@functools.lru_cache(maxsize=4)
def _article_set(w: World) -> frozenset[int]:
    return frozenset(article_tweets(w))


def article(w: World, a: Args) -> dict:
    i = w.tweet_by_id(a.require("tweet_id"), a.now)
    if i not in _article_set(w):
        raise NotFound("article not found")
    t = w.tweet(i)
    topic = TOPICS[t.topic][1]
    h = h64(w.seed, 55, i)
    openers, closers = OPENERS["en"], CLOSERS["en"]
    paragraphs = [
        f"{openers[(h >> (8 * n)) % len(openers)]} {topic}: part {n + 1}. {closers[(h >> (8 * n + 4)) % len(closers)]}"
        for n in range(3 + h % 4)
    ]
    return {
        "data": {
            "author": render.user(w, t.author),
            "replyCount": w.reply_count(i),
            "likeCount": t.likes,
            "quoteCount": w.quote_count(i),
            # The provider documents an integer here (tweets' viewCount stays the spec's string).
            "viewCount": t.views if t.views is not None else 0,
            "createdAt": render.created_at(t.ms // 1000),
            "title": f"What I learned about {topic}",
            "preview_text": paragraphs[0][:140],
            "cover_media_img_url": f"https://pbs.twimg.com/media/{b62(h, 15)}.jpg",
            "contents": [{"text": p} for p in paragraphs],
        }
    }
