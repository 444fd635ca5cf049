"""The world's users (handles, ids, lazily derived profiles) and the follower graph."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from .basis import (
    BIG_LURKER_FOLLOWERS,
    END_S,
    LURKER_MUL,
    LURKER_MUL_INV,
    N_ACTIVE,
    N_BIG,
    N_LURKERS,
    N_USERS,
    START_S,
    USER_ID_BASE,
    USER_ID_STEP,
    h64,
    is_digits,
    log_uniform,
)
from .people import BIG_ACCOUNTS, CITIES, COUNTRIES, FIRST, LAST, PLAIN_LAST, ROLES, SITES, TAGLINES
from .phrases import LANG_CUM, LANGS, TOPICS


@dataclass(frozen=True, slots=True)
class Profile:
    """Lazily derived user attributes (see World.profile)."""

    created_s: int
    description: str
    location: str | None
    site: str | None
    can_dm: bool
    has_cover: bool
    favourites: int
    listed: int
    media: int
    extra_statuses: int
    country: str
    username_changes: int
    pic: int


class Followers:
    """A user's followers, newest first: lurkers (arithmetic) then active users."""

    __slots__ = ("lurkers", "offset", "stride", "active")

    def __init__(self, lurkers: int, offset: int, stride: int, active: list[int]):
        self.lurkers, self.offset, self.stride, self.active = lurkers, offset, stride, active

    def __len__(self) -> int:
        return self.lurkers + len(self.active)

    def __getitem__(self, s: slice) -> list[int]:
        start, stop, _ = s.indices(len(self))
        out = [N_ACTIVE + (self.offset + k * self.stride) % N_LURKERS for k in range(start, min(stop, self.lurkers))]
        if stop > self.lurkers:
            out.extend(self.active[max(start - self.lurkers, 0) : stop - self.lurkers])
        return out

    def __iter__(self):
        return iter(self[0 : len(self)])


class Users:
    """World's users and follower graph (mixed into World, which builds them in order)."""

    def _make_users(self) -> None:
        """Handles and names of the active users; lurkers' are derived on demand."""
        seed = self.seed
        self.handles: list[str] = []
        self.names: list[str] = []
        self.by_handle: dict[str, int] = {}
        for i in range(N_ACTIVE):
            if i < N_BIG:
                handle, name = BIG_ACCOUNTS[i]
            else:
                h = h64(seed, 1, i)
                first, last = FIRST[h % len(FIRST)], PLAIN_LAST[(h >> 8) % len(LAST)]
                name = f"{first} {LAST[(h >> 8) % len(LAST)]}"
                style, n = (h >> 16) % 6, (h >> 24) % 100
                if style == 0:
                    handle = f"{first}{last}"
                elif style == 1:
                    handle = f"{first}_{last}".lower()
                elif style == 2:
                    handle = f"{first[0]}{last}".lower()
                elif style == 3:
                    handle = f"{first}{last}{n}"
                elif style == 4:
                    handle = f"{first}{last[:3]}{n:02d}".lower()
                else:
                    handle = f"{first}_{1970 + n % 40}"
                handle = handle[:15]
                k = 1
                while handle.lower() in self.by_handle:
                    k += 1
                    handle = f"{handle[:13]}{k}"
            self.handles.append(handle)
            self.names.append(name)
            self.by_handle[handle.lower()] = i

    def _lurker(self, i: int) -> tuple[str, str]:
        """(handle, name) of a lurker.  Like the platform's auto-generated handles they end
        in eight digits, which encode the lurker's index (an invertible affine map)."""
        h = h64(self.seed, 1, i)
        first, last = FIRST[h % len(FIRST)], LAST[(h >> 8) % len(LAST)]
        code = ((i - N_ACTIVE) * LURKER_MUL + self.seed) % 10**8
        return f"{first.lower()[:6]}{code:08d}", f"{first} {last}"

    def identity(self, i: int) -> tuple[str, str]:
        """(handle, display name) of any user."""
        return (self.handles[i], self.names[i]) if i < N_ACTIVE else self._lurker(i)

    def handle(self, i: int) -> str:
        return self.identity(i)[0]

    def name(self, i: int) -> str:
        return self.identity(i)[1]

    def user_id(self, i: int) -> str:
        return str(USER_ID_BASE + i * USER_ID_STEP + h64(self.seed, 2, i) % USER_ID_STEP)

    def user_by_id(self, uid: str) -> int | None:
        if not is_digits(uid):
            return None
        i = (int(uid) - USER_ID_BASE) // USER_ID_STEP
        return i if 0 <= i < N_USERS and self.user_id(i) == uid else None

    def user_by_handle(self, handle: str) -> int | None:
        handle = handle.lstrip("@").lower()
        if handle in self.by_handle:
            return self.by_handle[handle]
        code = handle[-8:]
        if len(handle) > 8 and is_digits(code):
            i = N_ACTIVE + (int(code) - self.seed) * LURKER_MUL_INV % 10**8
            if i < N_USERS and self._lurker(i)[0] == handle:
                return i
        return None

    def interests(self, i: int) -> tuple[str, tuple[int, int, int]]:
        """(main language, three favourite topics) of a user."""
        h = h64(self.seed, 17, i)
        pick = h % 100
        lang = "en" if i < N_BIG else next(lang for lang, cum in zip(LANGS, LANG_CUM) if pick < cum)
        n = len(TOPICS)
        t0, d = (h >> 8) % n, 1 + (h >> 16) % (n // 2 - 1)  # 0 < d < 2d < n: three distinct
        return lang, (t0, (t0 + d) % n, (t0 + 2 * d) % n)

    def is_blue(self, i: int) -> bool:
        return i < N_BIG or h64(self.seed, 3, i) % 100 < (9 if i < N_ACTIVE else 4)

    @functools.lru_cache(maxsize=20000)
    def profile(self, i: int) -> Profile:
        # Rendering a followers page builds hundreds of these, so every attribute comes from
        # the bits of two hashes (a random.Random per user costs more than all of them).
        h, g = h64(self.seed, 4, i), h64(self.seed, 18, i)
        active = i < N_ACTIVE
        if i < N_BIG:
            description = f"{self.names[i]}: the stories that matter, every day. Tips: DM us."
        elif not active and h % 10 < 4:  # many lurkers never write a bio
            description = ""
        else:
            first = (h >> 4) % len(ROLES)
            second = (first + 1 + (h >> 9) % (len(ROLES) - 1)) % len(ROLES)
            tagline = TAGLINES[(h >> 14) % len(TAGLINES)]
            description = " · ".join(filter(None, (ROLES[first], ROLES[second], tagline)))
        site = SITES[(h >> 18) % len(SITES)].format(h=self.handle(i).lower()) if active and (h >> 21) % 10 < 4 else None
        age = g % ((15 if active else 14) * 365 * 86400)
        return Profile(
            created_s=(START_S if active else END_S) - 1 - age,
            description=description,
            location=None if (h >> 25) % 10 < 3 else CITIES[(h >> 29) % len(CITIES)],
            site=site,
            can_dm=(h >> 34) % 100 < 35,
            has_cover=active and (h >> 41) % 4 != 0,
            favourites=log_uniform(h >> 44, 14),
            listed=log_uniform(h >> 54, 6) + (3000 if i < N_BIG else 0),
            media=log_uniform(g >> 40, 10) if active else (g >> 40) % 5,
            extra_statuses=log_uniform(g >> 50, 13) if active else (g >> 50) % 40,
            country=COUNTRIES[(g >> 20) % len(COUNTRIES)],
            username_changes=(0, 0, 0, 1, 1, 2, 3)[(g >> 30) % 7],
            pic=10**18 + (h ^ g) % (9 * 10**18),
        )

    # ---- follower graph ----------------------------------------------------

    def _make_follows(self) -> None:
        rng = self.rng
        weights = [rng.paretovariate(1.6) for _ in range(N_ACTIVE)]
        for b in range(N_BIG):
            weights[b] = 0.0  # big accounts are followed explicitly below
        cum, total = [], 0.0
        for w in weights:
            total += w
            cum.append(total)
        population = range(N_ACTIVE)
        self._followings: list[list[int]] = []
        followers: list[list[int]] = [[] for _ in range(N_ACTIVE)]
        for a in range(N_ACTIVE):
            k = min(400, int(rng.lognormvariate(3.2, 0.9)) + 1)
            chosen = dict.fromkeys(rng.choices(population, cum_weights=cum, k=k))
            chosen.pop(a, None)
            outs = [b for b in range(N_BIG) if b != a and rng.random() < 0.3] + list(chosen)
            outs.reverse()  # newest first: the last follow made comes first
            self._followings.append(outs)
            for b in outs:
                followers[b].append(a)
        self._followers: list[Followers] = []
        for u in range(N_ACTIVE):
            active = followers[u][::-1]
            if u < N_BIG:
                h = h64(self.seed, 5, u)
                stride = 1 + h % (N_LURKERS - 1)
                while math.gcd(stride, N_LURKERS) != 1:
                    stride += 1
                self._followers.append(Followers(BIG_LURKER_FOLLOWERS[u], (h >> 20) % N_LURKERS, stride, active))
            else:
                self._followers.append(Followers(0, 0, 1, active))
        self._inverse_strides = [pow(f.stride, -1, N_LURKERS) for f in self._followers[:N_BIG]]

    def followers(self, u: int) -> Followers:
        return self._followers[u] if u < N_ACTIVE else Followers(0, 0, 1, [])

    def following(self, u: int) -> list[int]:
        if u < N_ACTIVE:
            return self._followings[u]
        j = u - N_ACTIVE
        return [
            b
            for b in range(N_BIG)
            if ((j - self._followers[b].offset) * self._inverse_strides[b]) % N_LURKERS < self._followers[b].lurkers
        ]

    def verified_followers(self, u: int) -> list[int]:
        if u not in self._verified_followers:
            self._verified_followers[u] = [f for f in self.followers(u) if self.is_blue(f)]
        return self._verified_followers[u]
