"""Per-account caps (filter rules, monitors, alert rules, webhook endpoints) that hold under any concurrency and
across processes: one helper for every capped collection.

Counting and then inserting lets every concurrent create pass the count before any is inserted (80 concurrent
`add_rule` made 79 rules under a cap of 50). Here each item first takes a place in one document per account
and collection, `{_id: place, held: [{id, at}]}`, with one conditional update: `$push` only while the list is
shorter than the cap (`held.<cap - 1>` absent). The database applies updates of one document one at a time,
so no more than `cap` places are ever held, whichever process asks. The item is inserted after its place is
taken, and its place is given back after it is deleted.

With `unique` (a field of the item: a monitor's handle), a place also carries that value and is refused while
another place holds it, in the same update: "adding it again is the same monitor" holds for concurrent adds too
(20 at once made 3 monitors of one handle), and the caller learns the id of the one that holds it (`Held`).

A place can outlive its item (a process dying between the two writes, an insert that failed, a give-back that
did not happen): at the cap, places held for longer than GRACE whose item no longer counts are freed. The
first create of an account (or the first since this document existed) makes the document from the items
that count then.
"""

from datetime import UTC, datetime, timedelta

from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Longer than a create takes between taking its place and inserting its item: a younger place whose item is
# not there yet may be a create under way, never freed.
GRACE = timedelta(seconds=60)
ATTEMPTS = 20


class Held(Exception):
    """The unique value is held already: `item_id` is the item that holds it (perhaps a create still under way)."""

    def __init__(self, item_id: str):
        super().__init__(item_id)
        self.item_id = item_id


class Caps:
    def __init__(self, db: AsyncDatabase):
        self.places = db.cap_places

    async def insert(
        self, place: str, cap: int, collection: AsyncCollection, doc: dict, counted: dict, unique: str | None = None
    ) -> bool:
        """Inserts `doc` into `collection` if it fits under `cap`; False, with nothing written, if it does not.
        `place`: the account's places for this collection (e.g. "stream_rules:rule:<account>"); `counted`: the
        query of the account's items that count against the cap; `unique`: a field of `doc` whose value no two
        counted items share (Held, nothing written, when one has it)."""
        if cap < 1:
            return False
        entry = {"id": doc["_id"], "at": datetime.now(UTC)}
        free = {"_id": place, f"held.{cap - 1}": {"$exists": False}}
        if unique is not None:
            entry["u"] = doc[unique]
            free["held.u"] = {"$ne": doc[unique]}
        # A push refused while a place was free (the document missing, or freed meanwhile) is tried again; each
        # retry means other creates took places or deletes gave some back, so this ends: the bound is a backstop.
        for _ in range(ATTEMPTS):
            taken = await self.places.update_one(free, {"$push": {"held": entry}})
            if taken.matched_count:
                # A failed insert keeps its place (an insert that timed out may still have written the item):
                # freed at the cap once GRACE has passed and no such item counts.
                await collection.insert_one(doc)
                return True
            if not await self._room(place, cap, collection, counted, unique and (unique, doc[unique])):
                return False
        return False

    async def give_back(self, place: str, item_id: str) -> None:
        """The item was deleted (or no longer counts): its place is free."""
        await self.places.update_one({"_id": place}, {"$pull": {"held": {"id": item_id}}})

    async def _room(
        self, place: str, cap: int, collection: AsyncCollection, counted: dict, unique: tuple | None
    ) -> bool:
        """After a refused push: True if a place may be free now (the document was missing and is made, a place
        came free meanwhile, or places outliving their items were freed), False when all `cap` are held; Held
        when an item of `unique`'s (field, value) holds a place."""
        # The items first: an item inserted after this read has a place younger than GRACE, which is kept.
        field = unique[0] if unique else "_id"
        items = {d["_id"]: d.get(field) for d in await collection.find(counted, {"_id": 1, field: 1}).to_list(None)}
        held = await self.places.find_one({"_id": place})
        if held is None:
            places = [{"id": i, "at": EPOCH} | ({"u": items[i]} if unique else {}) for i in sorted(items)]
            try:  # the items there are now hold their places; they can be freed at once once deleted
                await self.places.insert_one({"_id": place, "held": places})
            except DuplicateKeyError:
                pass  # another create made it first
            return True
        cutoff = datetime.now(UTC) - GRACE
        if unique:
            holder = next((e for e in held["held"] if e.get("u") == unique[1]), None)
            if holder is not None and (holder["id"] in items or holder["at"] >= cutoff):
                raise Held(holder["id"])
        gone = [e["id"] for e in held["held"] if e["id"] not in items and e["at"] < cutoff]
        if not gone:
            return len(held["held"]) < cap
        # Conditional on their age still: a create retried under the same id would have a new place.
        await self.places.update_one({"_id": place}, {"$pull": {"held": {"id": {"$in": gone}, "at": {"$lt": cutoff}}}})
        return True  # freed, here or by another create at the same moment
