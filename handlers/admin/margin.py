"""GET /admin/margin: the operator's margin per provider and endpoint over a period (services/margin.py). No token
401, not an admin 403; `from` and `to` are ISO 8601 moments with an offset, `from` before `to`."""

from datetime import UTC, datetime, timedelta

from handlers.base import BaseHandler, admin_only
from handlers.validation import Field, ValidationError, error

DEFAULT_DAYS = 30  # the period when `from` is absent: this many days up to `to`


EARLIEST, LATEST = datetime(1970, 1, 1, tzinfo=UTC), datetime(9000, 1, 1, tzinfo=UTC)  # what a period may name


def _utc(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("z", "Z").replace("Z", "+00:00")).astimezone(UTC)


def _moment(value: str, loc: list) -> None:
    try:
        moment = _utc(value)
    except (ValueError, OverflowError):  # the year 1 at +14:00 is before the first moment a datetime holds
        raise ValidationError([error(loc, "Input should be a valid ISO 8601 datetime", "datetime_parsing")]) from None
    if not EARLIEST <= moment < LATEST:
        raise ValidationError([error(loc, "Input should be between 1970 and 9000", "value_error")])


FROM = Field(
    "from",
    str,
    required=False,
    format="date-time",
    check=_moment,
    description=f"Start of the period, inclusive (default: {DEFAULT_DAYS} days before `to`)",
)
TO = Field("to", str, required=False, format="date-time", check=_moment, description="End, inclusive (default: now)")


class AdminMarginHandler(BaseHandler):
    """Charged to customers against paid to providers, per provider and endpoint, with calls, failures, failovers."""

    @admin_only
    async def get(self) -> None:
        raw_from, raw_to = self.query_arg(FROM), self.query_arg(TO)
        until = _utc(raw_to) if raw_to else datetime.now(UTC)
        since = _utc(raw_from) if raw_from else max(EARLIEST, until - timedelta(days=DEFAULT_DAYS))
        if since > until:  # both ends inclusive: one moment is a period
            raise ValidationError([error(["query", "from"], "from must not be after to", "value_error")])
        margin = await self.services.margin.period(since, until)
        self.send_json({"period": {"from": since, "to": until}, **margin, "generated_at": datetime.now(UTC)})


routes = [(r"/admin/margin", AdminMarginHandler)]
