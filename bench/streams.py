"""Real time under load (docs/streams.md, issue 27's goals): `./dev bench --streams`.

One gateway (SecantusDB and the moving sandbox as their own processes), one account with `--rules` active
filter rules at 10 s intervals (a few busy `lang:en` rules, the rest quiet searches, as real accounts mix
them), and `--sockets` WebSocket clients, one per key, in this process. Over `--seconds` it reports:

- how late polls start against their due time (p50 / p99 / max; goal p99 <= 1 s), from each rule's
  `late_seconds` sampled every second;
- from an event's write (its `timestamp`, taken right after the provider's answer) to its receipt by the
  last of the clients (p50 / p99 per event; goal p99 <= 100 ms); the clients share this process's CPU, so
  this is an upper bound;
- the gateway's CPU per poll (its processes' CPU over the window / polls made).

`--streams-workers 2` runs the gateway with two workers and then checks exactly once: no tweet twice in a
rule's events, no poll made twice (two usage records of one poll from two processes), no two polls of a rule
within half an interval, and nothing the sandbox returned for a busy rule's search missing from its events.
"""

import asyncio
import json
import os
import time
import urllib.request
from collections import defaultdict
from datetime import datetime
from urllib.parse import quote

import orjson
import pymongo
import tornado.websocket
from tornado.httpclient import HTTPRequest

from bench.measure import children, cpu_seconds
from bench.stack import UPSTREAM_KEY, GatewayProcess, Stack
from storage.usage import flatten

INTERVAL = 10.0
BUSY = 10  # rules on `lang:en`: about one event a second between them


class StreamStack(Stack):
    def __init__(self, workers: int, **kw):
        super().__init__(**kw)
        self.workers = workers

    def start_gateway(self) -> None:
        with open(self.log_path, "ab") as log:
            self.gateway = GatewayProcess(self.env(), self.port, self.workers, stdout=log, stderr=log).start()


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _gateway_cpu(pid: int) -> float:
    return sum(cpu_seconds(p) for p in [pid, *children(pid)])


async def _client(url: str, key: str, received: dict, ready: list) -> None:
    ws = await tornado.websocket.websocket_connect(HTTPRequest(url, headers={"X-API-Key": key}))
    ready.append(ws)
    while True:
        text = await ws.read_message()
        if text is None:
            return
        if '"tweet"' in text[:40]:
            now = time.time() * 1000
            event = orjson.loads(text)
            received[event["event_id"]].append(now - event["timestamp"])


def _setup(stack: Stack, rules: int, clients: int) -> tuple[str, list[str], list[str], dict]:
    """An account with `clients` keys and `rules` active rules, switched on evenly over one interval."""
    status, user, _ = stack.call("POST", "/auth/register", {"email": "streams@example.com", "password": "bench pass 1"})
    token = user["token"]
    keys = [stack.call("POST", "/keys", {"name": f"k{i}"}, token=token)[1] for i in range(max(1, clients))]
    stack.call("POST", f"/keys/{keys[0]['key_id']}/topup", {"credits": 10**12}, token=token)
    catalog = orjson.loads(urllib.request.urlopen(stack.upstream + "/sandbox/catalog").read())
    quiet = [u["userName"] for u in catalog["users"][-200:]]  # seldom-posting users: quiet searches
    secret, ids, since = keys[0]["key"], [], {}
    started = time.monotonic()
    for n in range(rules):
        value = "lang:en" if n < BUSY else f"from:{quiet[n % len(quiet)]} lang:en"
        body = {"tag": f"r{n}", "value": value, "interval_seconds": INTERVAL}
        rule_id = stack.call("POST", "/oapi/tweet_filter/add_rule", body, key=secret)[1]["rule_id"]
        pause = started + n * INTERVAL / rules - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        since[rule_id] = int(time.time())
        stack.call("POST", "/oapi/tweet_filter/update_rule", {**body, "rule_id": rule_id, "is_effect": 1}, key=secret)
        ids.append(rule_id)
    return user["account_id"], [k["key"] for k in keys], ids, since


async def _measure(stack: Stack, db, keys: list[str], seconds: float) -> dict:
    received: dict = defaultdict(list)
    ready: list = []
    url = stack.url.replace("http", "ws", 1) + "/twitter/tweet/websocket"
    tasks = [asyncio.create_task(_client(url, k, received, ready)) for k in keys]
    while len(ready) < len(keys) and not any(t.done() for t in tasks):
        await asyncio.sleep(0.1)
    pid = stack.gateway.proc.pid
    polls_before = sum(r["poll_seq"] for r in db.stream_rules.find({}, {"poll_seq": 1}))
    cpu_before, late, seen = _gateway_cpu(pid), [], set()
    end = time.monotonic() + seconds
    received.clear()
    while time.monotonic() < end:
        await asyncio.sleep(1.0)
        for rule in db.stream_rules.find({"polled_at": {"$ne": None}}, {"polled_at": 1, "late_seconds": 1}):
            mark = (rule["_id"], rule["polled_at"])
            if mark not in seen and "late_seconds" in rule:
                seen.add(mark)
                late.append(rule["late_seconds"])
    cpu = _gateway_cpu(pid) - cpu_before
    polls = sum(r["poll_seq"] for r in db.stream_rules.find({}, {"poll_seq": 1})) - polls_before
    for ws in ready:
        ws.close()
    for task in tasks:
        task.cancel()
    full = [max(v) for v in received.values() if len(v) == len(keys)]
    return {
        "clients": len(ready),
        "polls": polls,
        "polls_per_second": round(polls / seconds, 1),
        "poll_late_p50_s": round(_pct(late, 0.5), 3),
        "poll_late_p99_s": round(_pct(late, 0.99), 3),
        "poll_late_max_s": round(max(late, default=float("nan")), 3),
        "events": len(received),
        "events_reaching_every_client": len(full),
        "fanout_last_client_p50_ms": round(_pct(full, 0.5), 1),
        "fanout_last_client_p99_ms": round(_pct(full, 0.99), 1),
        "gateway_cpu_per_poll_ms": round(cpu * 1000 / polls, 3) if polls else None,
        "gateway_cpu_share": round(cpu / seconds, 3),
    }


def _exactly_once(stack: Stack, db, account_id: str, rules: list[str], since: dict) -> dict:
    """Doubles, double polls and misses across the whole run (see the module docstring)."""
    doubles, double_polls, close_polls, missed = 0, 0, 0, 0
    by_rule = defaultdict(list)
    for event in db.stream_events.find({}):
        by_rule[event["rule_id"]].extend(t["id"] for t in event["tweets"])
    for ids in by_rule.values():
        doubles += len(ids) - len(set(ids))
    polls = defaultdict(lambda: defaultdict(set))  # rule -> poll (request id) -> processes that recorded it
    times = defaultdict(dict)
    for bucket in db.usage_buckets.find({"account_id": account_id}):
        for r in flatten(bucket):
            if r.get("stream_id") and r["status"] == 200:
                polls[r["stream_id"]][r["request_id"]].add(r["lease"])
                times[r["stream_id"]].setdefault(r["request_id"], r["ts"])
    for rule_polls in polls.values():
        double_polls += sum(1 for leases in rule_polls.values() if len(leases) > 1)
    for stamps in times.values():
        ordered = sorted(stamps.values())
        close_polls += sum(1 for a, b in zip(ordered, ordered[1:]) if (b - a).total_seconds() < INTERVAL / 2)
    # What the sandbox returns for the busy rules' search, from the first switch-on to 30 s before the end.
    until = int(time.time()) - 30
    start = min(since[r] for r in rules[:BUSY])
    found, cursor = [], ""
    while True:
        query = quote(f"lang:en since_time:{start} until_time:{until}")
        request = urllib.request.Request(
            f"{stack.upstream}/twitter/tweet/advanced_search?query={query}&queryType=Latest&cursor={cursor}",
            headers={"X-API-Key": UPSTREAM_KEY},
        )
        page = orjson.loads(urllib.request.urlopen(request).read())
        found += page.get("tweets") or []
        cursor = page.get("next_cursor") or ""
        if not page.get("has_next_page") or not cursor or not page.get("tweets"):
            break
    for rule_id in rules[:BUSY]:
        delivered = set(by_rule[rule_id])
        expected = {t["id"] for t in found if _created(t) > since[rule_id] + 1}
        missed += len(expected - delivered)
    return {
        "tweets_delivered_twice": doubles,
        "polls_made_twice": double_polls,
        "polls_within_half_an_interval": close_polls,
        "tweets_missed": missed,
        "tweets_checked": len(found),
    }


def _created(tweet: dict) -> float:
    return datetime.strptime(tweet["createdAt"], "%a %b %d %H:%M:%S %z %Y").timestamp()


def run(args) -> dict:
    env = {
        "MAX_KEYS_PER_ACCOUNT": str(args.sockets + 1),
        "STREAM_MAX_RULES": str(args.rules),
    }
    stack = StreamStack(args.streams_workers, gateway_env=env)
    try:
        stack.start()  # inside the try: a gateway that fails to start leaves no database or sandbox behind
        account_id, keys, rules, since = _setup(stack, args.rules, args.sockets)
        client = pymongo.MongoClient(stack.mongo.uri, tz_aware=True)
        db = client[stack.db_name]
        result = asyncio.run(_measure(stack, db, keys[: args.sockets], args.seconds))
        result |= {"rules": args.rules, "interval_s": INTERVAL, "workers": args.streams_workers}
        result["seconds"] = args.seconds
        if args.streams_workers > 1:
            time.sleep(2)  # the usage of the last polls flushed
            result["exactly_once"] = _exactly_once(stack, db, account_id, rules, since)
        client.close()
        return result
    finally:
        stack.stop()


def report(result: dict) -> str:
    rows = [f"| {name} | {value} |" for name, value in result.items() if name != "exactly_once"]
    rows += [f"| exactly once: {name} | {value} |" for name, value in (result.get("exactly_once") or {}).items()]
    return "| `./dev bench --streams` | |\n|---|---|\n" + "\n".join(rows)


def save(result: dict, out: str) -> None:
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as fh:
        json.dump(result, fh, indent=2, default=str)
