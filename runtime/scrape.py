"""/metrics for every worker of `serve --workers N` at once, gathered when scraped.

Each worker keeps its figures in plain memory: the data path adds nothing. A scrape, answered by
whichever worker takes the connection, collects that worker's series and asks each sibling for its
own over loopback (each worker listens on 127.0.0.1, on a port the parent bound before forking; the
requests carry a secret of the run), then answers them all, every series labelled worker="N".
Prometheus users sum over the label: `sum by (route) (rate(gateway_requests_total[5m]))`.

Counters never go backwards, a worker restart or replacement included: before a worker reports its
counters it writes them to its own file of the run's state folder (made by the parent, removed when it
exits; one file per worker start, `serial`), and the worker started next under the same index counts on
from its predecessor's file, so every value ever scraped stays a floor. A predecessor that died is read
once. One being replaced (SIGUSR2: it drains while its successor already serves) is read again at each of the
successor's reports until it wrote its last one (`final`, at the end of its drain): its calls of the drain
are counted too. A sibling that does not answer within PEER_TIMEOUT is left out of that scrape
(gateway_scrape_worker_up{worker} 0): its series are absent for one scrape, never reset.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass, field

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import exposition as openmetrics
from tornado.httpclient import AsyncHTTPClient, HTTPRequest

PEER_TIMEOUT = 2.0  # seconds a sibling worker gets to hand over its series
PEER_PATH = "/worker-metrics"
SECRET_HEADER = "X-Scrape-Secret"
CUMULATIVE = ("counter", "histogram")  # the families whose values must never go backwards

log = logging.getLogger("gateway.metrics")


@dataclass
class Scrape:
    """Where this worker stands among its siblings (a single process: worker 0 alone)."""

    index: int = 0
    peer_ports: dict[int, int] = field(default_factory=dict)  # sibling index -> its loopback port
    secret: str = ""
    state_dir: str = ""  # empty: nothing to restart from (a single process)
    serial: int = 0  # this worker's start among the run's: its file
    predecessor: int | None = None  # the serial of the worker before it under this index, if any
    predecessor_live: bool = False  # that worker drains still (a replacement): read until its final report
    floor: dict[str, tuple] = field(default_factory=dict)  # family -> (type, help, {sample key: value})

    def __post_init__(self) -> None:
        self._count_on()

    def _path(self, serial: int) -> str:
        return os.path.join(self.state_dir, f"worker-{self.index}.{serial}.json")

    def _count_on(self) -> None:
        """The floor from the predecessor's latest report, while it may still write one."""
        if not self.state_dir or self.predecessor is None:
            return
        path = self._path(self.predecessor)
        try:
            with open(path, "rb") as fh:
                stored = orjson.loads(fh.read())
        except FileNotFoundError:  # it never reported: nothing to count on from
            stored = None
        if stored is not None:
            families = stored["families"]
            self.floor = {name: (kind, doc, dict(_keyed(samples))) for name, kind, doc, samples in families}
        if not self.predecessor_live or (stored is not None and stored["final"]):  # it will not write again
            self.predecessor = None
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def own(self, registry: CollectorRegistry) -> list:
        """This worker's families as [name, type, help, [[sample name, labels, value]...]], counters counted on
        from the floor a predecessor left; written down before they are reported."""
        self._count_on()
        report, seen = [], set()
        for family in registry.collect():
            samples = [[s.name, s.labels, s.value] for s in family.samples]
            if family.type in CUMULATIVE and family.name in self.floor:
                samples = _raised(samples, self.floor[family.name][2])
            report.append([family.name, family.type, family.documentation, samples])
            seen.add(family.name)
        for name, (kind, doc, floor) in self.floor.items():  # a family with nothing since the restart
            if name not in seen:
                report.append([name, kind, doc, _raised([], floor)])
        if self.state_dir:
            self._write([family for family in report if family[1] in CUMULATIVE], final=False)
        return report

    def final(self, registry: CollectorRegistry) -> None:
        """At the end of a drain: the last counters, for the worker that replaces this one."""
        if self.state_dir:
            self._write([family for family in self.own(registry) if family[1] in CUMULATIVE], final=True)

    def _write(self, families: list, final: bool) -> None:
        path = self._path(self.serial)
        try:
            with open(path + ".tmp", "wb") as fh:
                fh.write(orjson.dumps({"final": final, "families": families}))
            os.replace(path + ".tmp", path)
        except OSError as exc:  # a full disk costs the restart floor, never the scrape
            log.warning("cannot keep metrics for a worker restart: %s", exc)

    async def gather(self, registry: CollectorRegistry) -> list[Metric]:
        """Every worker's families, each sample labelled with its worker."""
        reports = {self.index: self.own(registry)}
        indexes = sorted(self.peer_ports)
        answers = await asyncio.gather(*(self._ask(self.peer_ports[i]) for i in indexes))
        reports.update((i, report) for i, report in zip(indexes, answers) if report is not None)
        up = Metric("gateway_scrape_worker_up", "1 when the worker's series are in this scrape.", "gauge")
        for i in sorted([self.index, *indexes]):
            up.add_sample("gateway_scrape_worker_up", {"worker": str(i)}, 1 if i in reports else 0)
        return [*_merge(sorted(reports.items())), up]

    async def _ask(self, port: int) -> list | None:
        request = HTTPRequest(
            f"http://127.0.0.1:{port}{PEER_PATH}", headers={SECRET_HEADER: self.secret}, request_timeout=PEER_TIMEOUT
        )
        try:
            return orjson.loads((await AsyncHTTPClient().fetch(request)).body)
        except Exception as exc:  # a sibling restarting or stuck: left out of this scrape, said so
            log.warning("metrics of the worker on port %d not gathered: %s", port, exc)
            return None


def _key(name: str, labels: dict) -> str:
    return name + orjson.dumps(labels, option=orjson.OPT_SORT_KEYS).decode()


def _keyed(samples: list):
    for name, labels, value in samples:
        yield _key(name, labels), (name, labels, value)


def _raised(samples: list, floor: dict) -> list:
    """Samples plus the floor's values; the floor's samples not collected now are kept as they were."""
    raised, seen = [], set()
    for name, labels, value in samples:
        key = _key(name, labels)
        seen.add(key)
        raised.append([name, labels, value + (floor[key][2] if key in floor else 0)])
    return raised + [list(sample) for key, sample in floor.items() if key not in seen]


def _merge(reports: list) -> list[Metric]:
    families: dict[str, Metric] = {}
    for worker, report in reports:
        for name, kind, doc, samples in report:
            family = families.get(name) or families.setdefault(name, Metric(name, doc, kind))
            for sample, labels, value in samples:
                family.add_sample(sample, {**labels, "worker": str(worker)}, value)
    return list(families.values())


def render(families: list[Metric], accept: str) -> tuple[str, bytes]:
    """(content type, body): OpenMetrics when the scraper asks for it, the classic text format otherwise."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(families))
    if "application/openmetrics-text" in accept:
        return openmetrics.CONTENT_TYPE_LATEST, openmetrics.generate_latest(registry)
    return CONTENT_TYPE_LATEST, generate_latest(registry)


class _Fixed:
    def __init__(self, families: list[Metric]):
        self.families = families

    def collect(self):
        return self.families
