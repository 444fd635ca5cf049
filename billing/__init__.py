"""Billing documents: the customer's billing details, numbered receipts and credit notes, and the PDF renderer every
billing document uses (docs/billing.md). Above accounting/ (the ledger's identities) and payments/ (settled orders)."""
