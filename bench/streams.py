"""Real time under load (docs/streams.md, issue 27's goals): `./dev bench --streams`.

One gateway (SecantusDB and the moving sandbox as their own processes); one account with `--rules` filter
rules at `--interval` (10 s: a few busy `lang:en` rules, the rest quiet searches, as real accounts mix them),
`--sockets` keys each with its WebSocket client in this process (the gateway allows one socket per key), and
a webhook endpoint on a receiver in this process. Everything is set up through the public API, with concurrent
calls (bench/streams.py's `_setup`); the rules are switched on evenly over one interval, so their polls are
spread. Then, in order:

1. data calls of another account at `--data-rate` (open loop, bench/load.py in its own process) for
   `--data-seconds` after a short warm-up, no rule active: their p50 / p99;
2. the rules switched on (one interval);
3. `--seconds` of measure: how late polls start against their due time (p50 / p99 / max; goal p99 <= 1 s);
   from an event's write (its `timestamp`) to its receipt by the first and the last of the clients (goal p99
   <= 100 ms; the clients share this process's CPU: an upper bound); the gateway's CPU per poll (its
   processes' CPU over the window / polls made);
4. the same data calls with the rules active: p50 / p99 and what the rules add;
5. with `--streams-workers 2` (unless `--no-restart`), one worker killed (SIGKILL): `serve --workers N` starts
   it again, its clients reconnect with `since_event_id` once the dead connections' holds on their keys run
   out (6 s), and the run goes on max(`--seconds` / 2, 25 s), polls' lateness then reported apart;
6. exactly once, as users see it (bench/streams_clients.py): per client, events and tweets received twice and
   events missed; at the webhook receiver, tweets twice and missed (after `--drain` seconds for deliveries in
   retry); and in the database: no tweet twice in a rule's events, no poll made twice (two usage records of
   one poll from two processes), no two polls of a rule within half an interval, nothing the sandbox returned
   for a busy rule's search missing from its events. The gateway's log is kept and its errors counted.
"""

import asyncio
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from urllib.parse import quote

import orjson
import pymongo
import tornado.httpserver

from app.embedded import free_port
from bench.measure import HERE, children, cpu_seconds, metric_totals
from bench.streams_clients import Client, Receiver, tally
from gateway_testing.stack import UPSTREAM_KEY, GatewayProcess, Stack
from storage.usage import flatten

BUSY = 10  # rules on `lang:en`: about one event a second between them
CALLS_AT_ONCE = 16  # concurrent portal and rule calls during the setup
SLOW_CALL = (
    180.0  # seconds a setup call may take: at 1,000 rules on SecantusDB one took over 30 s (a figure, not a failure)
)
DATA_CONNECTIONS = 8
WARMUP = 3.0  # seconds of data calls before the first measured phase
DRAIN_SECONDS = 0.25  # between reads of what the clients received (their receipt times are stamped on arrival)
AFTER_RESTART = 25.0  # seconds the run goes on after a worker is killed: the keys' holds run out (6 s), resumes


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


def _ok(reply: tuple) -> dict:
    status, body, _ = reply
    if status != 200:
        raise RuntimeError(f"setup call answered {status}: {body}")
    return body


# --- setup through the public API --------------------------------------------------------------------------
def _setup(stack: Stack, args, hook_url: str) -> dict:
    """The socket account (its keys, rules and webhook endpoint) and the data account, made with concurrent
    calls; the rules are made inactive here and switched on later (`_switch_on`)."""
    timings, pool = {}, ThreadPoolExecutor(CALLS_AT_ONCE)
    started = time.monotonic()
    user = _ok(stack.call("POST", "/auth/register", {"email": "streams@example.com", "password": "bench pass 1"}))
    token = user["token"]
    names = [f"k{i}" for i in range(max(1, args.sockets))]
    keys = list(
        pool.map(lambda name: _ok(stack.call("POST", "/keys", {"name": name}, token=token, timeout=SLOW_CALL)), names)
    )
    _ok(stack.call("POST", f"/keys/{keys[0]['key_id']}/topup", {"credits": 10**12}, token=token))
    timings["keys_s"] = round(time.monotonic() - started, 1)
    hook = _ok(stack.call("POST", "/webhooks", {"url": hook_url, "description": "bench"}, token=token))
    data = _ok(stack.call("POST", "/auth/register", {"email": "data@example.com", "password": "bench pass 1"}))
    data_key = _ok(stack.call("POST", "/keys", {"name": "data"}, token=data["token"]))
    _ok(stack.call("POST", f"/keys/{data_key['key_id']}/topup", {"credits": 10**12}, token=data["token"]))
    catalog = orjson.loads(urllib.request.urlopen(stack.upstream + "/sandbox/catalog").read())
    quiet = [u["userName"] for u in catalog["users"][-200:]]  # seldom-posting users: quiet searches
    secret = keys[0]["key"]
    bodies = [
        {"tag": f"r{n}", "value": "lang:en" if n < BUSY else f"from:{quiet[n % len(quiet)]} lang:en"}
        | {"interval_seconds": args.interval}
        for n in range(args.rules)
    ]
    started = time.monotonic()
    added = pool.map(
        lambda b: _ok(stack.call("POST", "/oapi/tweet_filter/add_rule", b, key=secret, timeout=SLOW_CALL)), bodies
    )
    rules = [{**body, "rule_id": reply["rule_id"]} for body, reply in zip(bodies, added)]
    timings["rules_s"] = round(time.monotonic() - started, 1)
    pool.shutdown()
    return {
        "account_id": user["account_id"],
        "keys": [k["key"] for k in keys],
        "rules": rules,
        "hook_secret": hook["secret"],
        "data_plan": [(path, data_key["key"]) for path in _data_paths(catalog)],
        "timings": timings,
    }


def _data_paths(catalog: dict) -> list[str]:
    """Cheap, varied data calls (the sandbox answers at once): users' profiles, searches and tweets."""
    users = catalog["users"][:20]
    paths = [f"/social/user/info?userName={u['userName']}" for u in users]
    paths += [f"/social/tweet/advanced_search?query=from%3A{u['userName']}" for u in users[:10]]
    paths += [f"/social/tweets?tweet_ids={','.join(catalog['tweets'][i : i + 5])}" for i in range(0, 50, 5)]
    return paths


def _switch_on(stack: Stack, secret: str, rules: list[dict], interval: float) -> dict:
    """`update_rule` with `is_effect: 1` for every rule, evenly over one interval (each call sent at its time by
    a pool, not after the previous answer): their polls are spread. Returns {rule_id: switch-on unix second}."""
    since, start = {}, time.monotonic()

    def one(n: int) -> None:
        pause = start + n * interval / len(rules) - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        rule = rules[n]
        since[rule["rule_id"]] = int(time.time())
        body = {**rule, "is_effect": 1}
        _ok(stack.call("POST", "/oapi/tweet_filter/update_rule", body, key=secret, timeout=SLOW_CALL))

    with ThreadPoolExecutor(CALLS_AT_ONCE * 2) as pool:
        list(pool.map(one, range(len(rules))))
    return since


# --- measures ------------------------------------------------------------------------------------------------
class Gateway:
    """The gateway's CPU across its processes, a killed worker's included (its last sample)."""

    def __init__(self, stack: Stack):
        self.parent = stack.gateway.proc.pid
        self.cpu: dict[int, float] = {}

    def workers(self) -> list[int]:
        return sorted(children(self.parent))

    def sample(self) -> float:
        for pid in [self.parent, *self.workers()]:
            try:
                self.cpu[pid] = cpu_seconds(pid)
            except OSError:  # gone meanwhile: its last sample stays
                pass
        return sum(self.cpu.values())


def _fanout_buckets(url: str) -> dict[float, float]:
    """The gateway's own fan-out histogram (gateway_stream_fanout_seconds: an event's write to its frame handed
    to every socket of its account, in every worker): {upper bound: cumulative count}."""
    return {float(le): n for le, n in metric_totals(url, "gateway_stream_fanout_seconds_bucket", "le").items()}


def _fanout_in(before: dict[float, float], after: dict[float, float]) -> dict:
    """The window's fan-outs: the bucket bound 99 % of them are within, and the share within 100 ms."""
    window = {bound: after[bound] - before.get(bound, 0.0) for bound in sorted(after)}
    total = window.get(float("inf"), 0.0)
    if not total:
        return {"gateway_fanout_p99_within_ms": None, "gateway_fanout_within_100ms": None}
    p99 = min(bound for bound, count in window.items() if count >= 0.99 * total)
    return {"gateway_fanout_p99_within_ms": p99 * 1000, "gateway_fanout_within_100ms": round(window[0.1] / total, 4)}


async def _data_load(plan: list[tuple[str, str]], port: int, rate: float, seconds: float, work: str) -> dict:
    """bench/load.py's open loop in its own process (this one runs the WebSocket clients)."""
    path = os.path.join(work, "data-plan.json")
    with open(path, "w") as fh:
        json.dump(plan, fh)
    args = [str(port), str(rate), str(seconds), str(DATA_CONNECTIONS), path]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, os.path.join(HERE, "load.py"), *args, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    figures = json.loads(out)
    statuses = figures.pop("statuses")
    figures["non_200"] = sum(n for status, n in statuses.items() if str(status) != "200")
    return figures


async def _lateness(db, late: list[float], stop: asyncio.Event, timeline: list | None = None) -> None:
    """Each rule's `late_seconds` of its last poll, sampled every second (read in a thread: the clients' loop);
    `timeline` gets, per sample, [seconds since the first, polls new in it, the latest of them]. The polls
    already made at the first sample (while the rules were switched on) are not in the window."""
    first = time.monotonic()

    def read() -> list[dict]:
        query = {"polled_at": {"$ne": None}}
        return list(db.stream_rules.find(query, {"polled_at": 1, "late_seconds": 1}))

    seen = {(rule["_id"], rule["polled_at"]) for rule in await asyncio.to_thread(read)}
    while not stop.is_set():
        new = []
        for rule in await asyncio.to_thread(read):
            mark = (rule["_id"], rule["polled_at"])
            if mark not in seen and "late_seconds" in rule:
                seen.add(mark)
                new.append(rule["late_seconds"])
        late += new
        if timeline is not None:
            timeline.append([round(time.monotonic() - first), len(new), round(max(new, default=0), 1)])
        await asyncio.sleep(1.0)


async def _restart_one(gateway: Gateway) -> dict:
    """SIGKILL one worker of `serve --workers N`; the parent starts it again under the same index."""
    before = gateway.workers()
    victim = max(before, key=_sockets_open)  # the one holding more connections: most likely more clients
    gateway.sample()
    os.kill(victim, signal.SIGKILL)
    killed = time.monotonic()
    while time.monotonic() - killed < 30:
        await asyncio.sleep(0.1)
        now = gateway.workers()
        if victim not in now and len(now) == len(before):
            new = sorted(set(now) - set(before))[0]
            return {"killed_pid": victim, "new_pid": new, "respawned_after_s": round(time.monotonic() - killed, 1)}
    return {"killed_pid": victim, "new_pid": None, "respawned_after_s": None}


def _sockets_open(pid: int) -> int:
    try:
        return sum(
            1 for fd in os.listdir(f"/proc/{pid}/fd") if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        )
    except OSError:
        return 0


async def _drain(clients: list[Client]) -> None:
    """The clients' received frames read every DRAIN_SECONDS (Client.drain), until cancelled."""
    while True:
        await asyncio.sleep(DRAIN_SECONDS)
        for client in clients:
            client.drain()


def _polls(db) -> int:
    return sum(r["poll_seq"] for r in db.stream_rules.find({}, {"poll_seq": 1}))


async def _phases(stack: Stack, db, setup: dict, args, hook_port: int, work: str) -> dict:
    result: dict = {}
    receiver = Receiver(setup["hook_secret"])
    server = tornado.httpserver.HTTPServer(receiver.app())
    server.listen(hook_port, "127.0.0.1")
    url = stack.url.replace("http", "ws", 1) + "/twitter/tweet/websocket"
    clients = [Client(url, key) for key in setup["keys"][: args.sockets]]
    started = time.monotonic()
    tasks = [asyncio.create_task(c.run()) for c in clients]
    tasks.append(asyncio.create_task(_drain(clients)))
    while any(c.connections == 0 for c in clients) and time.monotonic() - started < 120:
        await asyncio.sleep(0.1)
    result["sockets_connected"] = sum(1 for c in clients if c.connections)
    result["setup"] = setup["timings"] | {"sockets_s": round(time.monotonic() - started, 1)}

    rate, port = args.data_rate, stack.port
    await _data_load(
        setup["data_plan"], port, rate, min(WARMUP, args.data_seconds), work
    )  # key caches, provider connections
    quiet = await _data_load(setup["data_plan"], port, rate, args.data_seconds, work)

    started = time.monotonic()
    since = await asyncio.to_thread(_switch_on, stack, setup["keys"][0], setup["rules"], args.interval)
    result["setup"]["switch_on_s"] = round(time.monotonic() - started, 1)
    late, stop = [], asyncio.Event()
    timeline: list = []
    sampler = asyncio.create_task(_lateness(db, late, stop, timeline))

    gateway, restart = Gateway(stack), None
    polls_before, cpu_before = await asyncio.to_thread(_polls, db), gateway.sample()
    fanout_before = await asyncio.to_thread(_fanout_buckets, stack.url)
    window_start_ms = time.time() * 1000
    await asyncio.sleep(args.seconds)
    window_end_ms = time.time() * 1000
    cpu = gateway.sample() - cpu_before
    fanout = _fanout_in(fanout_before, await asyncio.to_thread(_fanout_buckets, stack.url))
    polls = await asyncio.to_thread(_polls, db) - polls_before

    busy = await _data_load(setup["data_plan"], port, rate, args.data_seconds, work)
    measured = len(late)  # the polls before any restart
    if args.restart:  # after the measures: a restart's aftermath (resumes, a cold worker) is not in them
        restart = await _restart_one(gateway)
        # Its clients get their keys back once the dead connections' holds run out (6 s), then resume.
        await asyncio.sleep(max(args.seconds / 2, AFTER_RESTART))
        after = late[measured:]
        restart |= {"polls_after": len(after), "poll_late_after_p99_s": round(_pct(after, 0.99), 3)}
        restart["poll_late_after_max_s"] = round(max(after, default=float("nan")), 3)
    cutoff = datetime.now(UTC)
    stop.set()
    await sampler
    late = late[:measured]
    written = await asyncio.to_thread(_written, db, cutoff)
    deadline = time.monotonic() + args.drain
    while time.monotonic() < deadline and (
        set(written) - receiver.events or any(set(written) - c.events.keys() for c in clients)
    ):
        await asyncio.sleep(0.5)
    for client in clients:
        client.close()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    server.stop()

    # Write to receipt by the last client, for events written inside the window and reaching every client.
    got = defaultdict(list)
    for client in clients:
        for event_id, ms in client.latencies:
            got[event_id].append(ms)
    in_window = {e for e, (_, ms) in written.items() if window_start_ms <= ms <= window_end_ms}
    full = [v for e, v in got.items() if e in in_window and len(v) == len(clients)]
    first, last = [min(v) for v in full], [max(v) for v in full]
    seconds = args.seconds
    result |= {
        "polls": polls,
        "polls_per_second": round(polls / seconds, 1),
        "poll_late_p50_s": round(_pct(late, 0.5), 3),
        "poll_late_p99_s": round(_pct(late, 0.99), 3),
        "poll_late_max_s": round(max(late, default=float("nan")), 3),
        "polls_late_over_1s": sum(1 for x in late if x > 1),
        "poll_late_timeline": timeline,
        "events_in_window": len(in_window),
        "events_reaching_every_client": len(full),
        "fanout_first_client_p50_ms": round(_pct(first, 0.5), 1),
        "fanout_first_client_p99_ms": round(_pct(first, 0.99), 1),
        "fanout_last_client_p50_ms": round(_pct(last, 0.5), 1),
        "fanout_last_client_p99_ms": round(_pct(last, 0.99), 1),
        **fanout,
        "gateway_cpu_per_poll_ms": round(cpu * 1000 / polls, 3) if polls else None,
        "gateway_cpu_share": round(cpu / seconds, 3),
        "data_calls": {
            "rate": rate,
            "no_rule_active": quiet,
            "rules_active": busy,
            "added_p50_ms": round(busy["p50_ms"] - quiet["p50_ms"], 3),
            "added_p99_ms": round(busy["p99_ms"] - quiet["p99_ms"], 3),
        },
        "restart": restart,
        "exactly_once": tally(clients, {e: marks for e, (marks, _) in written.items()}, receiver),
        "since": since,
    }
    return result


def _written(db, cutoff: datetime) -> dict:
    """The events written up to `cutoff`: {event id: ([(rule_id, tweet id), ...], written at, unix ms)}."""
    found = {}
    for event in db.stream_events.find({"created_at": {"$lte": cutoff}}):
        marks = [(event["rule_id"], t["id"]) for t in event["tweets"]]
        found[event["_id"]] = (marks, event["created_at"].timestamp() * 1000)
    return found


def _exactly_once(stack: Stack, db, account_id: str, rules: list[str], since: dict, interval: float) -> dict:
    """In the database: doubles, double polls, close polls and misses across the whole run."""
    doubles, double_polls, missed = 0, 0, 0
    # The busy rules' last polls first, their events after: a poll writes its event before it moves the rule
    # on, so every poll seen here has its event below (the gateway still polls while this reads).
    polled = {"_id": {"$in": rules[:BUSY]}, "polled_at": {"$ne": None}}
    seen = {r["_id"]: r for r in db.stream_rules.find(polled, {"since_time": 1, "polled_at": 1})}
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
    close = []  # evidence: (rule, poll, its time, the next poll, its time)
    for rule_id, stamps in times.items():
        ordered = sorted((ts, request) for request, ts in stamps.items())
        close += [
            (rule_id, *a, *b) for a, b in zip(ordered, ordered[1:]) if (b[0] - a[0]).total_seconds() < interval / 2
        ]
    close_polls = len(close)
    # What the sandbox returns for the busy rules' search, from the second the gateway switched each on (its
    # `since_time`: a loaded gateway answers later than the bench asked) to the second before its last poll
    # began (a poll sees every second before its own).
    busy = [r for r in rules[:BUSY] if r in since and r in seen]
    started = {r: seen[r]["since_time"] for r in busy}
    upto = {r: int(seen[r]["polled_at"].timestamp()) - 1 for r in busy}
    found, cursor, missing = [], "", []
    while busy:
        query = quote(f"lang:en since_time:{min(started.values())} until_time:{max(upto.values())}")
        request = urllib.request.Request(
            f"{stack.upstream}/twitter/tweet/advanced_search?query={query}&queryType=Latest&cursor={cursor}",
            headers={"X-API-Key": UPSTREAM_KEY},
        )
        page = orjson.loads(urllib.request.urlopen(request).read())
        found += page.get("tweets") or []
        cursor = page.get("next_cursor") or ""
        if not page.get("has_next_page") or not cursor or not page.get("tweets"):
            break
    for rule_id in busy:
        delivered = set(by_rule[rule_id])
        expected = {t["id"] for t in found if started[rule_id] <= _created(t) < upto[rule_id]}
        missed += len(expected - delivered)
        missing += sorted(expected - delivered)[:5]
    return (
        {
            "db_tweets_twice_in_a_rule": doubles,
            "db_polls_made_twice": double_polls,
            "db_polls_within_half_an_interval": close_polls,
            "db_tweets_missed": missed,
            "db_tweets_checked": len(found),
            "db_busy_rules_last_poll_age_s": round(time.time() - min(upto.values(), default=time.time()), 1),
        }
        | ({"db_tweets_missed_sample": missing[:10]} if missing else {})
        | (
            {
                "db_close_polls_sample": [
                    [rule, r1, t1.isoformat(), r2, t2.isoformat()] for rule, t1, r1, t2, r2 in close[:5]
                ]
            }
            if close
            else {}
        )
    )


def _created(tweet: dict) -> float:
    return datetime.strptime(tweet["createdAt"], "%a %b %d %H:%M:%S %z %Y").timestamp()


LOG_TROUBLE = re.compile(r"\b(ERROR|CRITICAL|Traceback|WARNING)\b")


def _log(stack: Stack, out_dir: str, workers: int) -> dict:
    """The gateway's log kept next to the results; its warnings and errors counted, the first few quoted."""
    kept = os.path.join(out_dir, f"streams-w{workers}.log")
    os.makedirs(out_dir, exist_ok=True)
    shutil.copyfile(stack.log_path, kept)
    with open(kept, errors="replace") as fh:
        lines = [line.rstrip() for line in fh if LOG_TROUBLE.search(line)]
    return {"path": kept, "warnings_and_errors": len(lines), "first": lines[:5]}


def run(args) -> dict:
    env = {
        "MAX_KEYS_PER_ACCOUNT": str(args.sockets + 1),
        "STREAM_MAX_RULES": str(max(args.rules, 1)),
        "STREAM_MIN_INTERVAL": str(min(args.interval, 10)),
    }
    work = tempfile.mkdtemp(prefix="gw-streams-")
    stack = StreamStack(args.streams_workers, work_dir=work, gateway_env=env)
    try:
        stack.start()  # inside the try: a gateway that fails to start leaves no database or sandbox behind
        hook_port = free_port()
        setup = _setup(stack, args, f"http://127.0.0.1:{hook_port}/hook")
        client = pymongo.MongoClient(stack.mongo.uri, tz_aware=True)
        db = client[stack.db_name]
        result = {"rules": args.rules, "interval_s": args.interval, "workers": args.streams_workers}
        result["seconds"] = args.seconds
        result |= asyncio.run(_phases(stack, db, setup, args, hook_port, work))
        time.sleep(2)  # the usage of the last polls flushed
        since = result.pop("since")
        ids = [r["rule_id"] for r in setup["rules"]]
        result["exactly_once"] |= _exactly_once(stack, db, setup["account_id"], ids, since, args.interval)
        client.close()
        result["gateway_log"] = _log(stack, args.out_dir, args.streams_workers)
        return result
    finally:
        stack.stop()
        shutil.rmtree(work, ignore_errors=True)


ROWS = [  # (label, key path in the result)
    ("rules (interval s) / sockets connected / workers", None),
    ("setup: keys / rules made / sockets / rules switched on (s)", None),
    ("polls / s", "polls_per_second"),
    ("poll start after its due time, p50 / p99 / max (s)", None),
    ("polls started over 1 s late", "polls_late_over_1s"),
    ("event write to its receipt by the first / the last client, p50 / p99 (ms)", None),
    ("events in the window / reaching every client", None),
    ("gateway: event write to its frame handed to every socket, p99 within (ms) / share within 100 ms", None),
    ("gateway CPU per poll (ms; all its background work)", "gateway_cpu_per_poll_ms"),
    ("data calls at {rate}/s, no rule active: p50 / p99 (ms)", None),
    ("data calls at {rate}/s, rules active: p50 / p99 (ms)", None),
    ("data plane added p50 / p99 (ms)", None),
    ("worker restart (SIGKILL after the measures)", None),
]


def report(result: dict) -> str:
    r, setup, data = result, result["setup"], result["data_calls"]
    restart = result.get("restart")
    cells = {
        ROWS[0][0]: f"{r['rules']} ({r['interval_s']:g}) / {r['sockets_connected']} / {r['workers']}",
        ROWS[1][0]: " / ".join(str(setup.get(k)) for k in ("keys_s", "rules_s", "sockets_s", "switch_on_s")),
        ROWS[3][0]: f"{r['poll_late_p50_s']} / {r['poll_late_p99_s']} / {r['poll_late_max_s']}",
        ROWS[5][0]: f"{r['fanout_first_client_p50_ms']} / {r['fanout_first_client_p99_ms']}; "
        f"{r['fanout_last_client_p50_ms']} / {r['fanout_last_client_p99_ms']}",
        ROWS[6][0]: f"{r['events_in_window']} / {r['events_reaching_every_client']}",
        ROWS[7][0]: f"{r['gateway_fanout_p99_within_ms']} / {r['gateway_fanout_within_100ms']}",
        ROWS[9][0]: _latency(data["no_rule_active"]),
        ROWS[10][0]: _latency(data["rules_active"]),
        ROWS[11][0]: f"{data['added_p50_ms']:+} / {data['added_p99_ms']:+}",
        ROWS[12][0]: (
            f"worker {restart['killed_pid']} killed, restarted in {restart['respawned_after_s']} s; then "
            f"{restart['polls_after']} polls, late p99 / max {restart['poll_late_after_p99_s']} / "
            f"{restart['poll_late_after_max_s']} s"
            if restart
            else "none"
        ),
    }
    lines = ["| `./dev bench --streams` | |", "|---|---|"]
    for label, key in ROWS:
        lines.append(f"| {label.format(rate=data['rate'])} | {cells[label] if key is None else r[key]} |")
    for name, value in result["exactly_once"].items():
        if name.endswith("_sample"):  # evidence for the JSON, not the table
            continue
        lines.append(f"| exactly once: {name.replace('_', ' ')} | {value} |")
    log = result["gateway_log"]
    lines.append(f"| gateway log: warnings and errors | {log['warnings_and_errors']} ({log['path']}) |")
    return "\n".join(lines)


def _latency(figures: dict) -> str:
    extra = f", {figures['non_200']} not 200" if figures["non_200"] else ""
    return f"{figures['p50_ms']} / {figures['p99_ms']} ({figures['requests']} calls{extra})"


def save(result: dict, out: str) -> None:
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as fh:
        json.dump(result, fh, indent=2, default=str)
