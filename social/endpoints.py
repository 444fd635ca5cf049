"""The 30 data endpoints as one table: the spec's 24 and six more from the provider's current
documentation (tweet/retweeters, list/followers, list/members, community/members,
user/check_follow_relationship, article). Validation, pricing, routing, the OpenAPI
document and the tests are all driven from it.

Every constraint a parameter has is stated here and checked before anything is forwarded
(handlers/social.py), and shown in the OpenAPI document (handlers/openapi_paths.py): required,
integer bounds, booleans, id lists, enumerations (`choices`), cursors, and either-or groups
(`one_of`: at least one of these parameters must be sent).

Cursors: the provider's are opaque strings, so the gateway refuses only what cannot be one:
longer than CURSOR_MAX characters, or with a character outside printable ASCII (spaces, control
characters, non-ASCII). Empty (`cursor=`, which clients of the provider send for the first page) counts
as absent, and the OpenAPI document says so. followers_ids' cursor is an integer (-1 or 0 start).

A parameter sent twice counts with its last value; blank counts as absent. The provider is sent each
parameter of the table once, as validated and priced (handlers/social.py `upstream_query`).

`size` names how the page size of a call is known: a fixed maximum per page, a
query parameter (with its default and maximum), or the number of ids sent.
The most a call can cost (what is reserved before forwarding) is the price of
a full page of that size.
"""

from dataclasses import dataclass

import orjson
import simdjson


@dataclass(frozen=True)
class Param:
    name: str
    kind: str = "str"  # str | int | bool | ids | cursor
    required: bool = False
    choices: tuple[str, ...] = ()  # an enumeration: exactly one of these values (case-sensitive)
    minimum: int | None = None
    maximum: int | None = None  # for ids: how many ids at most
    description: str = ""
    example: str = ""  # for the OpenAPI document; empty: PARAM_DOCS's, by name


# A parameter's meaning and an example value the sandbox world knows (its catalog, seed 7: GET
# /sandbox/catalog), by name: what the OpenAPI document shows where a Param declares none of its own.
PARAM_DOCS = {
    "userName": ("The user's handle, without @", "AikoRomano92"),
    "userId": ("The user's numeric id", "275884976"),
    "user_id": ("The user's numeric id", "275884976"),
    "userIds": ("Comma-separated numeric user ids", "275884976,293704490"),
    "tweetId": ("The tweet's numeric id", "1840639654258017932"),
    "tweet_ids": ("Comma-separated numeric tweet ids", "1840639654258017932,1546935681187876333"),
    "listId": ("The list's numeric id", "1561682152788030209"),
    "community_id": ("The community's numeric id", "1688727882840348934"),
    "space_id": ("The Space's id", "1Xs2xrW61w430"),
    "query": ("Search words (advanced search accepts the provider's operators)", "Aiko"),
    "queryType": ("Result order", "Latest"),
    "cursor": ("next_cursor of the previous page; empty or absent: the first page", ""),
    "count": ("How many items at most", "20"),
    "pageSize": ("Items per page", "20"),
    "woeid": ("Where On Earth id of the place (1: worldwide)", "1"),
    "includeReplies": ("Include the user's replies", "false"),
    "includeParentTweet": ("With each reply, the tweet it answers", "false"),
    "list_id": ("The list's numeric id", "1561682152788030209"),
    "tweet_id": ("The id of a post that carries an article", "1860969277379309489"),
    "source_user_name": ("Handle of the source user", "AikoRomano92"),
    "target_user_name": ("Handle of the target user", "ivan_haddad"),
    "sinceTime": ("Unix seconds: only posts made at or after this time", "1700000000"),
    "untilTime": ("Unix seconds: only posts made before this time", "2000000000"),
}


def param_docs(param: Param) -> tuple[str, str]:
    """(description, example) of a parameter: its own, else PARAM_DOCS's (choices: the first choice)."""
    text, example = PARAM_DOCS.get(param.name, ("", ""))
    example = param.example or example or (param.choices[0] if param.choices else "")
    return param.description or text, example


@dataclass(frozen=True)
class Size:
    fixed: int = 0  # a page holds at most this many items
    param: str = ""  # or: the page size is this parameter...
    default: int = 0  # ...with this default when absent


@dataclass(frozen=True)
class Endpoint:
    path: str  # after /social
    params: tuple[Param, ...]
    results: str  # the key of the results array ("data" for single objects)
    msg_key: str  # "message" or "msg", as the spec's table shows
    price: str  # a rule name in metering/pricing.py
    size: Size
    summary: str
    paged: bool = True
    available: bool = True
    one_of: tuple[str, ...] = ()  # at least one of these parameters is required

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)


# Text rules, stated once: the handler checks them (handlers/social.py) and the OpenAPI document shows
# them (handlers/openapi_paths.py). Patterns use ASCII classes only, so Python's `re` and JSON Schema's
# ECMA-262 regexes read them alike (`\d` would also match "٣" in Python).
STRING_MAX = 1000  # every string parameter without a rule of its own: at most this many characters
# A provider's cursor is its own string of its own length, and with several providers ours is the provider's name,
# `~` and its cursor (percent-escaped where it is not printable ASCII): room for that, not a guess at its size.
CURSOR_MAX = 4096
CURSOR_PATTERN = "^[!-~]*$"  # printable ASCII, no spaces; empty counts as absent (the first page)
ID_PART = " *[0-9]{1,20} *"  # one id of an id list: ASCII digits, spaces around it allowed
NOT_BLANK = r"\S"  # a required value needs a character that is not whitespace


def ids_pattern(maximum: int) -> str:
    """An id list of 1..maximum ids, as one pattern (the handler tells a malformed list from a long one)."""
    return f"^{ID_PART}(,{ID_PART}){{0,{maximum - 1}}}$"


CURSOR = Param(
    "cursor",
    "cursor",
    description=f"Opaque cursor: next_cursor of the previous page (printable ASCII, at most {CURSOR_MAX} characters).",
)
USER_EITHER = ("userName", "userId")
TWEET_PAGE = Size(fixed=20)
# The provider's time filters (Unix seconds) on mentions, replies and quotes.
SINCE_TIME = Param("sinceTime", "int", minimum=0, description="Unix seconds: only posts made at or after this time.")
UNTIL_TIME = Param("untilTime", "int", minimum=0, description="Unix seconds: only posts made before this time.")


def _ep(path, params, results, msg_key, price, size, summary, **kw) -> Endpoint:
    return Endpoint(path, tuple(params), results, msg_key, price, size, summary, **kw)


ENDPOINTS: tuple[Endpoint, ...] = (
    _ep(
        "/tweet/advanced_search",
        [
            Param("query", required=True),
            Param("queryType", choices=("Latest", "Top"), description="Latest (default) or Top"),
            CURSOR,
        ],
        "tweets",
        "message",
        "tweets",
        TWEET_PAGE,
        "Search posts with operators (from:, since:, lang:, min_faves:, ...).",
    ),
    _ep(
        "/user/tweet_timeline",
        [Param("userId", required=True), CURSOR, Param("includeReplies", "bool"), Param("includeParentTweet", "bool")],
        "tweets",
        "message",
        "tweets",
        TWEET_PAGE,
        "A user's posts-and-replies timeline.",
    ),
    _ep(
        "/tweet/thread_context",
        [Param("tweetId", required=True), CURSOR],
        "replies",
        "message",
        "tweets",
        TWEET_PAGE,
        "A post with its ancestors and replies.",
    ),
    _ep(
        "/user/verifiedFollowers",
        [Param("user_id", required=True), CURSOR],
        "followers",
        "message",
        "verified_followers",
        Size(fixed=20),
        "Verified accounts that follow the user.",
    ),
    _ep(
        "/community/tweets",
        [Param("community_id", required=True), CURSOR],
        "tweets",
        "msg",
        "tweets",
        TWEET_PAGE,
        "A Community's post timeline.",
    ),
    _ep(
        "/user/followers",
        [Param("userName", required=True), CURSOR, Param("pageSize", "int", minimum=1, maximum=200)],
        "followers",
        "message",
        "follows",
        Size(param="pageSize", default=200),
        "Followers, newest first.",
    ),
    _ep(
        "/user/followings",
        [Param("userName", required=True), CURSOR, Param("pageSize", "int", minimum=1, maximum=200)],
        "followings",
        "message",
        "follows",
        Size(param="pageSize", default=200),
        "Accounts the user follows, newest first.",
    ),
    _ep(
        "/spaces/detail",
        [Param("space_id", required=True)],
        "data",
        "msg",
        "panel",
        Size(fixed=1),
        "Title, host, speakers, state and listener counts of a Space.",
        paged=False,
    ),
    _ep(
        "/user_about",
        [Param("userName", required=True)],
        "data",
        "msg",
        "panel",
        Size(fixed=1),
        "Extended about panel of an account.",
        paged=False,
    ),
    _ep(
        "/user/batch_info_by_ids",
        [Param("userIds", "ids", required=True, maximum=100)],
        "users",
        "msg",
        "batch_profiles",
        Size(param="userIds"),
        "Full profiles for up to 100 user ids.",
        paged=False,
    ),
    _ep(
        "/user/info",
        [Param("userName", required=True)],
        "data",
        "msg",
        "profiles",
        Size(fixed=1),
        "One profile by handle.",
        paged=False,
    ),
    _ep(
        "/trends",
        [Param("woeid", "int", minimum=1), Param("count", "int", minimum=1, maximum=100)],
        "trends",
        "msg",
        "call",
        Size(param="count", default=30),
        "Trending topics for a WOEID.",
        paged=False,
    ),
    _ep(
        "/list/tweets_timeline",
        [Param("listId", required=True), CURSOR],
        "tweets",
        "message",
        "tweets",
        TWEET_PAGE,
        "Posts of a List, newest first.",
    ),
    _ep(
        "/user/followers_ids",
        [
            Param("userName", description="The user's handle; send userName or userId"),
            Param("userId", description="The user's numeric id; send userName or userId"),
            Param("count", "int", minimum=50, maximum=5000),
            Param("cursor", "int", minimum=-1, description="Integer cursor from next_cursor.", example="-1"),
        ],
        "ids",
        "msg",
        "follower_ids",
        Size(param="count", default=5000),
        "Follower ids in large pages.",
        one_of=USER_EITHER,
    ),
    _ep(
        "/tweet/quotes",
        [
            Param("tweetId", required=True),
            SINCE_TIME,
            UNTIL_TIME,
            Param("includeReplies", "bool", description="Include quotes that are also replies (default true)."),
            CURSOR,
        ],
        "tweets",
        "message",
        "tweets",
        TWEET_PAGE,
        "Quote posts of a post.",
    ),
    _ep(
        "/user/last_tweets",
        [
            Param("userName", description="The user's handle; send userName or userId"),
            Param("userId", description="The user's numeric id; send userName or userId"),
            CURSOR,
            Param("includeReplies", "bool"),
        ],
        "tweets",
        "message",
        "tweets",
        TWEET_PAGE,
        "A user's most recent posts, newest first.",
        one_of=USER_EITHER,
    ),
    _ep(
        "/tweet/replies/v2",
        [
            Param("tweetId", required=True),
            CURSOR,
            Param(
                "queryType",
                choices=("Relevance", "Latest", "Likes"),
                description="Relevance (default), Latest or Likes",
            ),
        ],
        "tweets",
        "message",
        "tweets",
        TWEET_PAGE,
        "Replies in the newer threaded shape.",
    ),
    _ep(
        "/tweet/replies",
        [Param("tweetId", required=True), SINCE_TIME, UNTIL_TIME, CURSOR],
        "replies",
        "message",
        "tweets",
        TWEET_PAGE,
        "Direct replies to a post.",
    ),
    _ep(
        "/user/mentions",
        [Param("userName", required=True), SINCE_TIME, UNTIL_TIME, CURSOR],
        "tweets",
        "message",
        "tweets",
        TWEET_PAGE,
        "Posts mentioning the user, newest first.",
    ),
    _ep(
        "/user/search",
        [Param("query", required=True), CURSOR],
        "users",
        "msg",
        "profiles",
        Size(fixed=20),
        "Profiles by keyword.",
    ),
    _ep(
        "/tweets",
        [Param("tweet_ids", "ids", required=True, maximum=100)],
        "tweets",
        "message",
        "tweets",
        Size(param="tweet_ids"),
        "Hydrate up to 100 post ids.",
        paged=False,
    ),
    _ep(
        "/community/info",
        [Param("community_id", required=True)],
        "data",
        "msg",
        "panel",
        Size(fixed=1),
        "A Community's profile.",
        paged=False,
    ),
    # --- beyond the spec: the provider's current documentation (docs/api.md, "Data endpoints") ------
    _ep(
        "/tweet/retweeters",
        [Param("tweetId", required=True), CURSOR],
        "users",
        "message",
        "profiles",
        Size(fixed=100),
        "Accounts that reposted a post, about 100 a page.",
    ),
    _ep(
        "/list/followers",
        [Param("list_id", required=True), CURSOR],
        "followers",
        "msg",
        "list_call",
        Size(fixed=20),
        "Followers of a List, 20 a page.",
    ),
    _ep(
        "/list/members",
        [Param("list_id", required=True), CURSOR],
        "members",
        "msg",
        "list_call",
        Size(fixed=20),
        "Members of a List, 20 a page.",
    ),
    _ep(
        "/community/members",
        [Param("community_id", required=True), CURSOR],
        "members",
        "msg",
        "profiles",
        Size(fixed=20),
        "Members of a Community, 20 a page.",
    ),
    _ep(
        "/user/check_follow_relationship",
        [
            Param("source_user_name", required=True, description="Handle of the source user"),
            Param("target_user_name", required=True, description="Handle of the target user"),
        ],
        "data",
        "message",
        "relationship",
        Size(fixed=1),
        "Whether the source user follows, and is followed by, the target user.",
        paged=False,
    ),
    _ep(
        "/article",
        [Param("tweet_id", required=True, description="Id of the post that carries the article")],
        "article",
        "message",
        "article",
        Size(fixed=1),
        "A long-form article by the id of its post.",
        paged=False,
    ),
    _ep(
        "/community/get_tweets_from_all_community",
        [Param("query", required=True), Param("queryType"), CURSOR],
        "tweets",
        "msg",
        "call",
        TWEET_PAGE,
        "Unavailable: answers 501, never charged.",
        available=False,
    ),
    _ep(
        "/community/moderators",
        [Param("community_id", required=True), CURSOR],
        "users",
        "msg",
        "call",
        Size(fixed=20),
        "Unavailable: answers 501, never charged.",
        available=False,
    ),
)

BY_PATH = {e.path: e for e in ENDPOINTS}


def _group(endpoint: Endpoint) -> str:
    for prefix, group in (("/community/", "communities"), ("/list/", "lists"), ("/spaces/", "spaces")):
        if endpoint.path.startswith(prefix):
            return group
    if endpoint.path == "/trends":
        return "trends"
    return "tweets" if endpoint.results in ("tweets", "replies", "article") else "users"


# Names a key's allowed_endpoints may use instead of listing paths (docs/api.md, "Key properties").
GROUPS: dict[str, frozenset[str]] = {
    name: frozenset(e.path for e in ENDPOINTS if _group(e) == name) for name in sorted({_group(e) for e in ENDPOINTS})
}


def scope_of(names) -> frozenset[str]:
    """The data paths a list of allowed_endpoints entries (paths or group names) permits."""
    paths: set[str] = set()
    for name in names:
        paths |= GROUPS.get(name) or {name}
    return frozenset(paths)


def page_size(endpoint: Endpoint, args: dict) -> int:
    """How many items a call may return, from the validated arguments."""
    size = endpoint.size
    if size.fixed:
        return size.fixed
    value = args.get(size.param)
    if isinstance(value, list):
        return len(value)
    return value if value is not None else size.default


def count_items(endpoint: Endpoint, body: dict) -> int:
    """Items in an upstream answer: the length of its results array, 1 for a single object."""
    results = body.get(endpoint.results)
    if isinstance(results, list):
        return len(results)
    return 1 if results else 0


# --- reading an answer without building it ---------------------------------------------------------
# A charge needs two facts of the upstream's answer: does it say "status": "error", and how many items
# does its results field hold; the crawl guard a third: the page's next cursor. Parsing a 36 KB page into
# Python objects to learn them cost ~0.25 ms per call. simdjson validates the whole document (structure,
# UTF-8, number ranges) at SIMD speed and hands out lazy proxies, so reading the status, the length of one
# array and the next cursor builds nothing else: ~25 us for a 20-post page where the full parse took
# ~120 us. (msgspec with a struct per envelope and raw items took ~40 us but does not check UTF-8 in
# skipped strings; adding that check cost another ~25 us.) Whatever simdjson refuses or reads differently
# from orjson (a byte-order mark, duplicate keys, 64-bit limits, an object or array where the next cursor
# belongs) goes to the full parse, so both paths give the same answer; tests/data/test_answer_reading.py
# compares them over every page of every sandbox endpoint.
_PARSER = simdjson.Parser()  # reused: one document at a time, read before the next parse
_BOM = b"\xef\xbb\xbf"
# The provider's error statuses: "error" everywhere, "failed" too on `article` (its documentation).
# A tuple, not a set: an untrusted "status" may be an unhashable object (compared, never hashed).
_ERROR_STATUSES = ("error", "failed")
_PROXIES = (simdjson.Object, simdjson.Array)


def read_answer(endpoint: Endpoint, body: bytes) -> tuple[bool, int, str] | None:
    """(says error, items, next cursor) of an upstream answer; None when it is not a JSON object."""
    if body[:3] == _BOM:
        return _read_fully(endpoint, body)
    try:
        doc = _PARSER.parse(body)
    except (ValueError, RuntimeError):  # invalid for simdjson, or past its limits: orjson decides
        return _read_fully(endpoint, body)
    if not isinstance(doc, simdjson.Object):
        return None
    if len(set(doc.keys())) != len(doc):  # duplicate keys: orjson keeps the last, simdjson the first
        return _read_fully(endpoint, body)
    more, cursor = doc.get("has_next_page"), doc.get("next_cursor")
    if isinstance(more, _PROXIES) or isinstance(cursor, _PROXIES):  # untrusted oddities: read as orjson reads them
        return _read_fully(endpoint, body)
    results = doc.get(endpoint.results)
    if isinstance(results, (simdjson.Array, simdjson.Object)):
        items = len(results) if isinstance(results, simdjson.Array) else 1 if len(results) else 0
    else:
        items = 1 if results else 0
    return doc.get("status") in _ERROR_STATUSES, items, _next_cursor(more, cursor)


def _read_fully(endpoint: Endpoint, body: bytes) -> tuple[bool, int, str] | None:
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return read_parsed(endpoint, parsed)


def read_parsed(endpoint: Endpoint, parsed) -> tuple[bool, int, str] | None:
    """read_answer's facts of an answer already parsed with orjson (for a caller that needs the page itself)."""
    if not isinstance(parsed, dict):
        return None
    following = _next_cursor(parsed.get("has_next_page"), parsed.get("next_cursor"))
    return parsed.get("status") in _ERROR_STATUSES, count_items(endpoint, parsed), following


def _next_cursor(more, cursor) -> str:
    """The next cursor a page offers, as text ("": none, or has_next_page false)."""
    following = cursor if more else ""
    return str(following) if following not in (None, "") else ""
