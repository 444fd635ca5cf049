"""The deterministic synthetic world behind the sandbox upstream.

Everything derives from one integer seed, so the same seed always yields the
same users, tweets and pages.  Generation has to stay well under a second, so:

* Users are split into 3,000 *active* users (they post, follow each other,
  run lists, communities and spaces) and 57,000 *lurkers* that only exist to
  follow the five big accounts.  Only handles and display names are built
  eagerly (lookups and user search need them); every other profile attribute
  is derived on demand from a hash of (seed, user index).
* A big account's lurker followers are an arithmetic progression over the
  lurker index range (offset + k * stride, stride coprime with the range), so
  tens of thousands of followers cost nothing to store and the inverse
  ("does lurker g follow big account b?") is one modular multiplication.
* Tweets are generated once, in chronological order, as compact records;
  reply threads, quotes and mentions are indexed as they are made.
"""

from __future__ import annotations

import functools
import random

from .groups import Groups
from .live import Live
from .tweets import Tweets
from .users import Users


class World(Users, Tweets, Groups, Live):
    """The world of one seed; its parts are built in this order because each draws on the one rng."""

    def __init__(self, seed: int):
        self.seed = seed
        self.rng = random.Random(seed)
        self._make_users()
        self._make_follows()
        self._make_tweets()
        self._make_lists()
        self._make_communities()
        self._make_spaces()
        self._make_live()
        self._norm: list[str] | None = None
        self._list_timelines: dict[int, list[int]] = {}
        self._verified_followers: dict[int, list[int]] = {}


@functools.lru_cache(maxsize=4)
def get_world(seed: int) -> World:
    """Worlds are immutable once built, so every app with the same seed shares one."""
    return World(seed)
