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

import calendar
import functools
import math
import random
import re
import zlib
from dataclasses import dataclass

N_ACTIVE = 3000
N_LURKERS = 57000
N_USERS = N_ACTIVE + N_LURKERS
N_TWEETS = 30000
N_LISTS = 40
N_EMPTY_LISTS = 6
N_SPACES = 24
# Lurker followers of the big accounts (user indices 0..4), newest first.
BIG_LURKER_FOLLOWERS = (21000, 27000, 34000, 45000, 56000)
N_BIG = len(BIG_LURKER_FOLLOWERS)

START_S = calendar.timegm((2022, 6, 1, 0, 0, 0))
END_S = calendar.timegm((2024, 12, 31, 0, 0, 0))
# The platform started showing view counts in December 2022; older tweets have none.
VIEWS_SINCE_S = calendar.timegm((2022, 12, 15, 0, 0, 0))
TWEPOCH_MS = 1288834974657  # snowflake epoch

# User ids are BASE + index * STEP + jitter (jitter < STEP): they look arbitrary
# but decode back to the index with one division.
USER_ID_BASE = 12_000_000
USER_ID_STEP = 104_729

M64 = (1 << 64) - 1
LURKER_MUL = 7_654_321  # coprime with 10**8
LURKER_MUL_INV = pow(LURKER_MUL, -1, 10**8)


def h64(*parts: int) -> int:
    """A cheap, well-mixed deterministic hash: fold the parts, then splitmix64's finalizer."""
    x = 0
    for p in parts:
        x = (x * 0x100000001B3 + p) & M64
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & M64
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & M64
    return x ^ (x >> 31)


LANGS = ("en", "es", "pt", "ja", "fr", "de")
LANG_CUM = (68, 78, 84, 90, 95, 100)  # cumulative percentages of LANGS
LANG_INDEX = {lang: k for k, lang in enumerate(LANGS)}

# hashtag, then the topic phrase in each of LANGS
TOPICS = (
    (
        "MachineLearning",
        "machine learning",
        "aprendizaje automático",
        "aprendizado de máquina",
        "機械学習",
        "apprentissage automatique",
        "maschinelles Lernen",
    ),
    ("OpenSource", "open source", "código abierto", "código aberto", "オープンソース", "logiciel libre", "Open Source"),
    (
        "Coffee",
        "specialty coffee",
        "café de especialidad",
        "café especial",
        "スペシャルティコーヒー",
        "café de spécialité",
        "Spezialitätenkaffee",
    ),
    (
        "TrailRunning",
        "trail running",
        "carreras de montaña",
        "corrida de trilha",
        "トレイルランニング",
        "trail en montagne",
        "Traillauf",
    ),
    (
        "ClimateData",
        "climate data",
        "datos climáticos",
        "dados climáticos",
        "気候データ",
        "données climatiques",
        "Klimadaten",
    ),
    (
        "RustLang",
        "async rust",
        "rust asíncrono",
        "rust assíncrono",
        "非同期Rust",
        "rust asynchrone",
        "asynchrones Rust",
    ),
    (
        "Python",
        "python packaging",
        "empaquetado en python",
        "empacotamento python",
        "Pythonのパッケージング",
        "packaging python",
        "Python-Packaging",
    ),
    (
        "StreetPhotography",
        "street photography",
        "fotografía callejera",
        "fotografia de rua",
        "ストリート写真",
        "photo de rue",
        "Straßenfotografie",
    ),
    (
        "Sourdough",
        "sourdough bread",
        "pan de masa madre",
        "pão de fermentação natural",
        "サワードウ",
        "pain au levain",
        "Sauerteigbrot",
    ),
    (
        "CityCycling",
        "city cycling",
        "bici urbana",
        "ciclismo urbano",
        "街乗り自転車",
        "vélo en ville",
        "Radfahren in der Stadt",
    ),
    (
        "RocketLaunch",
        "rocket launches",
        "lanzamientos de cohetes",
        "lançamentos de foguetes",
        "ロケット打ち上げ",
        "lancements de fusées",
        "Raketenstarts",
    ),
    ("IndieGames", "indie games", "juegos indie", "jogos indie", "インディーゲーム", "jeux indés", "Indie-Spiele"),
    ("Jazz", "jazz records", "discos de jazz", "discos de jazz", "ジャズのレコード", "vinyles de jazz", "Jazzplatten"),
    (
        "UrbanGardening",
        "urban gardening",
        "huertos urbanos",
        "hortas urbanas",
        "都市園芸",
        "jardinage urbain",
        "Urban Gardening",
    ),
    (
        "EV",
        "electric cars",
        "coches eléctricos",
        "carros elétricos",
        "電気自動車",
        "voitures électriques",
        "Elektroautos",
    ),
    (
        "Football",
        "football tactics",
        "táctica de fútbol",
        "tática de futebol",
        "サッカー戦術",
        "tactique du foot",
        "Fußballtaktik",
    ),
    ("RemoteWork", "remote work", "teletrabajo", "trabalho remoto", "リモートワーク", "télétravail", "Homeoffice"),
    (
        "Keyboards",
        "mechanical keyboards",
        "teclados mecánicos",
        "teclados mecânicos",
        "メカニカルキーボード",
        "claviers mécaniques",
        "mechanische Tastaturen",
    ),
    (
        "Birding",
        "bird watching",
        "observación de aves",
        "observação de aves",
        "バードウォッチング",
        "observation des oiseaux",
        "Vogelbeobachtung",
    ),
    (
        "Chess",
        "chess openings",
        "aperturas de ajedrez",
        "aberturas de xadrez",
        "チェスのオープニング",
        "ouvertures aux échecs",
        "Schacheröffnungen",
    ),
)

OPENERS = {
    "en": (
        "Just shipped a post on",
        "Thinking a lot about",
        "Hot take on",
        "Can't stop reading about",
        "Anyone else excited about",
        "Quick thread on",
        "Spent the whole morning on",
        "Still not convinced by the hype around",
        "Finally tried",
        "Weekend plans: more",
    ),
    "es": (
        "Acabo de publicar algo sobre",
        "Pensando mucho en",
        "Opinión impopular sobre",
        "No puedo dejar de leer sobre",
        "Hilo rápido sobre",
        "Por fin probé",
    ),
    "pt": (
        "Acabei de postar sobre",
        "Pensando muito em",
        "Opinião polêmica sobre",
        "Não paro de ler sobre",
        "Fio rápido sobre",
        "Finalmente testei",
    ),
    "ja": ("今日は", "最近ずっと", "ついに", "週末は", "改めて"),
    "fr": (
        "Je viens de publier sur",
        "Je pense beaucoup à",
        "Avis tranché sur",
        "Petit thread sur",
        "J'ai enfin testé",
    ),
    "de": (
        "Gerade einen Beitrag über",
        "Denke viel nach über",
        "Steile These zu",
        "Kurzer Thread zu",
        "Endlich ausprobiert:",
    ),
}
CLOSERS = {
    "en": (
        "today.",
        "and it is wild.",
        "— thoughts?",
        "again.",
        "for the third time this week.",
        "with friends.",
        "and honestly it is great.",
        "lol",
        "🚀",
        "🔥",
    ),
    "es": ("hoy.", "¿qué opinan?", "otra vez.", "con amigos.", "🔥"),
    "pt": ("hoje.", "o que acham?", "de novo.", "com os amigos.", "🚀"),
    "ja": ("について考えてる。", "が楽しい。", "やってみた！", "最高。", "🔥"),
    "fr": ("aujourd'hui.", "vous en pensez quoi ?", "encore.", "entre amis.", "🔥"),
    "de": ("heute.", "was meint ihr?", "schon wieder.", "mit Freunden.", "🚀"),
}
EXTRA_TAGS = ("tbt", "MondayMotivation", "100DaysOfCode", "Weekend", "NowPlaying", "BuildInPublic")
LINK_TARGETS = (
    "github.com/{s}",
    "www.youtube.com/watch?v={s}",
    "{s}.substack.com/p/notes",
    "arxiv.org/abs/2403.{n}",
    "en.wikipedia.org/wiki/{t}",
    "medium.com/@{s}/post-{n}",
)

FIRST = (
    "Maria",
    "James",
    "Aiko",
    "Luca",
    "Sofia",
    "Noah",
    "Amara",
    "Mateo",
    "Chloe",
    "Ethan",
    "Yuki",
    "Lena",
    "Omar",
    "Priya",
    "Jonas",
    "Elena",
    "Kai",
    "Zara",
    "Diego",
    "Hannah",
    "Ravi",
    "Ingrid",
    "Tomas",
    "Leila",
    "Felix",
    "Mia",
    "Arjun",
    "Clara",
    "Hugo",
    "Nadia",
    "Sam",
    "Ana",
    "Ben",
    "Ines",
    "Theo",
    "Julia",
    "Marco",
    "Sara",
    "Liam",
    "Emma",
    "Kenji",
    "Fatima",
    "Pablo",
    "Greta",
    "Samir",
    "Olga",
    "Victor",
    "Rosa",
    "Ivan",
    "Alice",
    "Bruno",
    "Camila",
    "Dmitri",
    "Eva",
    "Gabriel",
    "Hana",
    "Isaac",
    "Jade",
    "Karim",
    "Lucia",
)
LAST = (
    "Garcia",
    "Smith",
    "Tanaka",
    "Rossi",
    "Müller",
    "Silva",
    "Okafor",
    "Dubois",
    "Kim",
    "Novak",
    "Santos",
    "Nguyen",
    "Johansson",
    "Patel",
    "Fischer",
    "Lopez",
    "Sato",
    "Moreau",
    "Costa",
    "Brown",
    "Ivanova",
    "Hernandez",
    "Schmidt",
    "Yamamoto",
    "Ferreira",
    "Martin",
    "Kowalski",
    "Haddad",
    "Berg",
    "Oliveira",
    "Walker",
    "Romano",
    "Suzuki",
    "Lindqvist",
    "Mendes",
    "Clarke",
    "Weber",
    "Alvarez",
    "Nakamura",
    "Petrov",
    "Rahman",
    "Young",
    "Bianchi",
    "Kaur",
    "Laurent",
    "Hoffmann",
    "Diaz",
    "Ito",
    "Eriksen",
    "Reyes",
)
PLAIN_LAST = tuple(n.replace("ü", "u") for n in LAST)  # handles are ASCII
BIG_ACCOUNTS = (
    ("NewsWireDaily", "NewsWire Daily"),
    ("OrbitalFacts", "Orbital Facts"),
    ("CodeDigest", "Code Digest"),
    ("ChefMarta", "Chef Marta Ruiz"),
    ("PitchsideHub", "Pitchside Hub"),
)
CITIES = (
    "Lisbon, Portugal",
    "Berlin",
    "Tokyo",
    "São Paulo",
    "Austin, TX",
    "Lagos",
    "Paris",
    "Toronto",
    "Seoul",
    "Mexico City",
    "London",
    "Bangalore",
    "Melbourne",
    "Madrid",
    "Nairobi",
    "Stockholm",
    "Buenos Aires",
    "Milan",
    "Osaka",
    "Vancouver",
)
COUNTRIES = (
    "Portugal",
    "Germany",
    "Japan",
    "Brazil",
    "United States",
    "Nigeria",
    "France",
    "Canada",
    "South Korea",
    "Mexico",
    "United Kingdom",
    "India",
    "Australia",
    "Spain",
    "Kenya",
    "Sweden",
    "Argentina",
    "Italy",
)
ROLES = (
    "Data engineer",
    "Coffee nerd",
    "Runner",
    "Photographer",
    "PhD student",
    "Product designer",
    "Backend dev",
    "Teacher",
    "Climate researcher",
    "Home baker",
    "Chess addict",
    "Indie game dev",
    "Cyclist",
    "Jazz fan",
    "Writer",
    "Open source maintainer",
    "Gardener",
    "Football analyst",
    "Birder",
    "Keyboard collector",
)
TAGLINES = (
    "Opinions my own.",
    "Building things.",
    "Mostly harmless.",
    "Learning in public.",
    "he/him",
    "she/her",
    "they/them",
    "Coffee first.",
    "Views are mine.",
    "",
)
SITES = ("github.com/{h}", "{h}.dev", "linktr.ee/{h}", "{h}.substack.com", "{h}.net")

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

B62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def b62(n: int, width: int) -> str:
    out = []
    for _ in range(width):
        n, r = divmod(n, 62)
        out.append(B62[r])
    return "".join(out)


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


class World:
    def __init__(self, seed: int):
        self.seed = seed
        self.rng = random.Random(seed)
        self._make_users()
        self._make_follows()
        self._make_tweets()
        self._make_lists()
        self._make_communities()
        self._make_spaces()
        self._norm: list[str] | None = None
        self._list_timelines: dict[int, list[int]] = {}
        self._verified_followers: dict[int, list[int]] = {}

    # ---- users -------------------------------------------------------------

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
            favourites=_log_uniform(h >> 44, 14),
            listed=_log_uniform(h >> 54, 6) + (3000 if i < N_BIG else 0),
            media=_log_uniform(g >> 40, 10) if active else (g >> 40) % 5,
            extra_statuses=_log_uniform(g >> 50, 13) if active else (g >> 50) % 40,
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

    # ---- tweets ------------------------------------------------------------

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
        t, seed = self.tweets[i], self.seed
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

    def tweet_by_id(self, tid: str) -> int | None:
        return self.by_id.get(tid)

    def reply_count(self, i: int) -> int:
        return len(self.replies.get(i, ()))

    def quote_count(self, i: int) -> int:
        return len(self.quotes.get(i, ()))

    def statuses_count(self, u: int) -> int:
        return (len(self.by_author[u]) if u < N_ACTIVE else 0) + self.profile(u).extra_statuses

    def engagement(self, i: int) -> int:
        """The ranking score of advanced_search Top and replies/v2 Relevance."""
        t = self.tweets[i]
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

    # ---- lists, communities, spaces ----------------------------------------

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


_WORD = re.compile(r"\w+")


def is_digits(s: str) -> bool:
    return s.isascii() and s.isdigit()


def _log_uniform(bits: int, octaves: int) -> int:
    """An integer between 0 and 2**octaves, log-uniformly distributed (heavy-tailed counts)."""
    return int(2 ** ((bits & 0x3FF) / 1023 * octaves)) - 1


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


@functools.lru_cache(maxsize=4)
def get_world(seed: int) -> World:
    """Worlds are immutable once built, so every app with the same seed shares one."""
    return World(seed)
