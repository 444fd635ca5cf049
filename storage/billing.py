"""Billing documents' collections: each account's billing details, and the numbered documents (receipts, credit
notes) with the one write that numbers them.

    billing_details    {_id: account id, legal_name, address, country, tax_id, email, updated_at}
    billing_documents  {_id: number ("R-2026-000123"), series ("R" receipts, "C" credit notes), seq (1, 2, ...),
                       source (what it is for: once per source), account_id, issued_at, ... its contents}
                       unique (series, seq), unique source

Numbering without gaps and without transactions (docs/billing.md): a number is not taken from a counter and then
used; the document is inserted with the next number of its series in one insert. The next number is the highest
`seq` of the series plus one, and the unique (series, seq) index refuses a second document with the same number:
of two issuers that read the same highest number, one insert lands and the other is refused and reads again. A
number therefore exists only as a whole document; there is no moment (a crash, a lost answer) at which a number
is taken but its document not written, so no gap. The unique `source` index makes a document for the same payment
(or the same receipt's void) exist at most once, whichever process or retry issues it.
"""

from datetime import datetime

from pymongo import ASCENDING, DESCENDING, IndexModel, ReturnDocument
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError

INDEXES = [
    IndexModel([("series", ASCENDING), ("seq", DESCENDING)], unique=True),
    IndexModel([("source", ASCENDING)], unique=True),
    IndexModel([("account_id", ASCENDING), ("series", ASCENDING), ("seq", DESCENDING)]),
    IndexModel([("series", ASCENDING), ("issued_at", ASCENDING)]),
]
DETAILS = ("legal_name", "address", "country", "tax_id", "email")


class Taken(Exception):
    """The number was written by another issuer first: read the highest again."""


class BillingStore:
    def __init__(self, db: AsyncDatabase):
        self.details_ = db.billing_details
        self.documents = db.billing_documents

    async def ensure_indexes(self) -> None:
        await self.documents.create_indexes(INDEXES)

    # --- billing details ----------------------------------------------------------------------------------
    async def details(self, account_id: str) -> dict | None:
        return await self.details_.find_one({"_id": account_id})

    async def put_details(self, account_id: str, fields: dict, at: datetime) -> dict:
        """Replaces the account's details whole (a field left out is cleared)."""
        return await self.details_.find_one_and_update(
            {"_id": account_id},
            {"$set": {**{name: fields.get(name, "") for name in DETAILS}, "updated_at": at}},
            upsert=True,
            return_document=ReturnDocument.AFTER,
        )

    # --- numbered documents -------------------------------------------------------------------------------
    async def highest(self, series: str) -> int:
        """The highest number issued in the series; 0 before the first."""
        last = await self.documents.find_one({"series": series}, {"seq": 1}, sort=[("seq", DESCENDING)])
        return last["seq"] if last else 0

    async def by_source(self, source: str) -> dict | None:
        return await self.documents.find_one({"source": source})

    async def insert(self, document: dict) -> None:
        """Writes a numbered document; Taken when its number is someone else's (its source may be issued too:
        the caller looks that up first on its next try)."""
        try:
            await self.documents.insert_one(document)
        except DuplicateKeyError:
            raise Taken(document["_id"]) from None

    async def get(self, number: str, account_id: str | None = None) -> dict | None:
        """One document; with `account_id`, only if it is that account's."""
        query = {"_id": number} if account_id is None else {"_id": number, "account_id": account_id}
        return await self.documents.find_one(query)

    async def numbers_of(self, account_id: str, sources: list[str]) -> dict[str, str]:
        """The numbers of the account's documents issued for `sources`, by source (monthly statements name the
        receipt of each top-up)."""
        cursor = self.documents.find({"account_id": account_id, "source": {"$in": sources}}, {"source": 1})
        return {doc["source"]: doc["_id"] async for doc in cursor}

    async def of_account(self, account_id: str, series: str, limit: int) -> list[dict]:
        """The account's documents of the series, newest first."""
        cursor = self.documents.find({"account_id": account_id, "series": series}).sort("seq", DESCENDING)
        return await cursor.limit(limit).to_list(None)

    async def issued_between(self, series: str, start: datetime, end: datetime) -> list[dict]:
        """The series' documents issued in [start, end), in number order (every account's)."""
        query = {"series": series, "issued_at": {"$gte": start, "$lt": end}}
        return await self.documents.find(query).sort("seq", ASCENDING).to_list(None)

    async def mark_void(self, number: str, void: dict) -> dict | None:
        """The receipt shows the credit note that voids it; set once, the original otherwise unchanged."""
        await self.documents.update_one({"_id": number, "void": None}, {"$set": {"void": void}})
        return await self.documents.find_one({"_id": number})
