"""TTL indexes, and on SecantusDB the passes that expire documents in their place.

MongoDB's TTL monitor deletes what a TTL index says has expired. SecantusDB's sweeper does too, but it keeps
a read snapshot from one sweep to the next (a minute) whenever a TTL index exists: for that minute the server
keeps every older version of every document written since, and at a hundred stream polls a second it stalled
for 10-25 s every minute (docs/changelog.md; its `ttl_sweep_seconds` setting is not passed on by its command
line). So on SecantusDB, unless DB_EXPIRY_SECONDS is 0, these indexes are made without their expiry and every
gateway process deletes the expired documents itself, every DB_EXPIRY_SECONDS: one indexed delete per index,
over the wire, so the server lets go of its snapshot when the statement ends. Passes of several processes
delete each document once between them.
"""

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from pymongo import IndexModel
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase


@dataclass(frozen=True)
class Expiring:
    collection: AsyncCollection
    field: str
    seconds: float
    partial: dict | None

    def query(self, now: datetime) -> dict:
        """What MongoDB's monitor deletes: a date before now - seconds (any date of an array), within the
        index's partial filter; documents without a date in the field stay."""
        expired = {self.field: {"$lt": now - timedelta(seconds=self.seconds)}}
        return {"$and": [expired, self.partial]} if self.partial else expired


class Expiry:
    def __init__(self, db: AsyncDatabase, every_seconds: float):
        self.db, self.every_seconds = db, every_seconds
        self.passes = False  # this process expires documents (start: SecantusDB and every_seconds > 0)
        self.expiring: list[Expiring] = []

    async def start(self) -> None:
        """Learns whether the database is SecantusDB (it names itself in buildInfo); before any index."""
        if self.every_seconds > 0:
            self.passes = "secantusVersion" in await self.db.client.admin.command("buildInfo")

    async def create_indexes(self, collection: AsyncCollection, models: list[IndexModel]) -> None:
        """`models` on `collection`; with passes, a TTL index is made without its expiry and its documents
        expire in `once`. An index kept from a run that decided otherwise (or with another expiry: a changed
        retention) is made again."""
        wanted = []
        for model in models:
            spec = dict(model.document)
            ttl = spec.get("expireAfterSeconds")
            if ttl is not None and self.passes:
                (field,) = spec["key"]
                self.expiring.append(Expiring(collection, field, ttl, spec.get("partialFilterExpression")))
                spec.pop("expireAfterSeconds")
            wanted.append(spec)
        existing = {index["name"]: index.get("expireAfterSeconds") async for index in await collection.list_indexes()}
        for spec in wanted:
            if spec["name"] in existing and existing[spec["name"]] != spec.get("expireAfterSeconds"):
                await collection.drop_index(spec["name"])
        await collection.create_indexes([IndexModel(list(s.pop("key").items()), **s) for s in wanted])

    async def once(self, now: datetime | None = None) -> int:
        """One pass: the expired documents of every index made without its expiry; how many were deleted."""
        now = now or datetime.now(UTC)
        deleted = 0
        for expiring in self.expiring:
            deleted += (await expiring.collection.delete_many(expiring.query(now))).deleted_count
        return deleted
