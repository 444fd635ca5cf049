"""The one clock the stores, the usage records and the loops above them read: timezone-aware UTC (MongoDB keeps
UTC). Tests move it forward with `travel` (a month's end, the next month's start) to see what a calendar does to
the books; time then runs on from there. Only ever forward: other processes judge this one's heartbeats
(storage/leases.py) by their own clocks."""

from datetime import UTC, datetime, timedelta

_offset = timedelta(0)


def now_utc() -> datetime:
    return datetime.now(UTC) + _offset


def travel(to: datetime | None) -> None:
    """From now on `now_utc()` reads `to` and runs on from there; None: the real time again."""
    global _offset
    _offset = timedelta(0) if to is None else to - datetime.now(UTC)
