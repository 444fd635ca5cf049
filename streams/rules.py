"""What a rule or monitor asks the provider, what it costs, and what its events look like. Pure: no I/O.

A filter rule polls `tweet/advanced_search` (queryType=Latest, newest first) with its own query; an account
monitor polls the same search with `from:<user>` (its latest posts, replies, quotes and retweets). Either asks
only for what is new: `since_id:<newest delivered>` once something was delivered, before that
`since_time:<when it was switched on>`. So a quiet rule's poll finds nothing and costs the per-call minimum.
A burst larger than one poll reads (MAX_PAGES) is not lost: its older part is a gap the next polls read
(`max_id:`) after what is new, until nothing is left of it.
"""

import math
import re
from datetime import datetime

from metering.pricing import Prices
from social.endpoints import ENDPOINTS, Endpoint, page_size

SEARCH: Endpoint = next(e for e in ENDPOINTS if e.path == "/tweet/advanced_search")
SIZE = page_size(SEARCH, {})  # a poll asks for one page
ROUTE = "/social" + SEARCH.path  # the usage record's endpoint: a poll is that data call
RECENT_IDS = 20  # delivered ids remembered per rule, against a provider answering one twice (kept small: every
# poll rewrites the rule's document)
USER_NAME = re.compile(r"@?([A-Za-z0-9_]{1,15})")


def poll_query(rule: dict, region: dict) -> str:
    """The search of one of a poll's regions (`regions`), with the provider's operators (reference.md): what
    lies after its lower bound (an id, else a time) and, for a gap, before its upper one."""
    base = f"from:{rule['user_name']}" if rule["kind"] == "monitor" else rule["value"]
    since = f"since_id:{region['above']}" if region["above"] else f"since_time:{region['since_time']}"
    upto = f" max_id:{int(region['below']) - 1}" if region.get("below") else ""
    return f"{base} {since}{upto}"


def regions(rule: dict) -> list[dict]:
    """What a poll reads, newest first: what is new since the rule's cursor, then the gaps older polls left.
    Each is `{above, since_time, below}`: after the cursor it had (an id, else a time) and, for a gap (the
    older part of a poll that reached MAX_PAGES), before the oldest tweet that poll delivered."""
    new = {"above": rule.get("since_id"), "since_time": rule["since_time"], "below": None}
    return [new, *(rule.get("gaps") or [])]


def gap_below(region: dict, oldest: str) -> dict:
    """What is left of a region once its tweets down to `oldest` are delivered."""
    return {**region, "below": oldest}


def least_cost(prices: Prices) -> int:
    """A poll that finds nothing: the per-call minimum of the search."""
    return prices.cost(SEARCH.price, 0, SIZE)


def most_cost(prices: Prices) -> int:
    return prices.cost(SEARCH.price, SIZE, SIZE)


def polls_per_day(interval_seconds: float) -> int:
    return math.ceil(86400 / interval_seconds)


def hour_need(rules: list[dict], prices: Prices) -> int:
    """Credits the next hour of these rules' polls costs at least (each at the per-call minimum)."""
    least = least_cost(prices)
    return sum(math.ceil(3600 / r["interval_seconds"]) * least for r in rules)


def newer(tweet_id: str, than: str | None) -> bool:
    """Tweet ids are decimal snowflakes: a longer one is newer; equal lengths compare as text."""
    if than is None:
        return True
    return (len(tweet_id), tweet_id) > (len(than), than)


def fresh(tweets: list, seen: set[str], above: str | None) -> list[dict]:
    """The tweets of an answer not delivered yet: newer than `above` (the region's lower bound), not among the
    `seen` ids (the rule's recent ids and this poll's), each once."""
    out, ids = [], set()
    for tweet in tweets:
        tid = str(tweet.get("id", "")) if isinstance(tweet, dict) else ""
        if tid and tid not in seen and tid not in ids and newer(tid, above):
            ids.add(tid)
            out.append(tweet)
    return out


def reached(tweets: list, above: str | None) -> bool:
    """Whether an answer goes down to the region's lower bound (the id its search asked to be above)."""
    return above is not None and any(isinstance(t, dict) and not newer(str(t.get("id", "")), above) for t in tweets)


def cursor_after(rule: dict, delivered: list[dict]) -> dict:
    """The rule's cursor once `delivered` is out: the newest id and the recent ids."""
    since = rule.get("since_id")
    for tweet in delivered:
        if newer(str(tweet["id"]), since):
            since = str(tweet["id"])
    recent = [str(t["id"]) for t in delivered] + list(rule.get("recent_ids") or ())
    return {"since_id": since, "recent_ids": recent[:RECENT_IDS]}


def millis(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def message(event: dict) -> dict:
    """The provider's event format (plus `event_id`), as sockets and webhooks send it."""
    return {
        "event_type": "tweet",
        "event_id": event["_id"],
        "rule_id": event["rule_id"],
        "rule_tag": event["rule_tag"],
        "tweets": event["tweets"],
        "timestamp": millis(event["created_at"]),
    }
