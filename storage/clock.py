"""The one clock the stores, and the loops above them, read: timezone-aware UTC (MongoDB keeps UTC)."""

from datetime import UTC, datetime


def now_utc() -> datetime:
    return datetime.now(UTC)
