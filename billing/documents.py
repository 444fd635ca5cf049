"""What a receipt and a credit note show, as a page (billing/pdf.py `Document`) and as an email's text: only what
the stored document holds (copied when it was issued), never today's settings or details."""

from billing.pdf import Column, Document, Party, Table, amount

METHODS = {"crypto": "Crypto top-up", "admin": "Credits paid to the operator"}


def issuer_party(issuer: dict) -> Party:
    lines = [issuer["name"], *issuer.get("address", "").splitlines()]
    if issuer.get("tax_id"):
        lines.append(f"Tax ID: {issuer['tax_id']}")
    return Party("Issued by", [line for line in lines if line.strip()])


def customer_party(customer: dict, account_id: str) -> Party:
    lines = [customer.get("legal_name") or f"Account {account_id}", *customer.get("address", "").splitlines()]
    lines += [customer.get("country", "")]
    if customer.get("tax_id"):
        lines.append(f"Tax ID: {customer['tax_id']}")
    lines += [customer.get("email", ""), f"Account {account_id}" if customer.get("legal_name") else ""]
    return Party("Billed to", [line for line in lines if line.strip()])


def _paid(payment: dict) -> str:
    if payment.get("amount_paid") is None:
        return ""
    if payment.get("currency") == "USD":
        return f"{amount(float(payment['amount_paid']))} USD"
    return f"{payment['amount_paid']:,.8f}".rstrip("0").rstrip(".") + f" {payment.get('currency') or ''}".rstrip()


def document(doc: dict) -> Document:
    issued = doc["issued_at"].strftime("%Y-%m-%d %H:%M UTC")
    parties = (issuer_party(doc["issuer"]), customer_party(doc["customer"], doc["account_id"]))
    footer = doc["issuer"].get("footer", "")
    if doc["kind"] == "credit_note":
        return Document(
            operator=doc["issuer"]["name"],
            title=f"Credit note {doc['_id']}",
            parties=parties,
            facts=(("Date", issued), ("Voids receipt", doc["voids"]), ("Reason", doc["reason"])),
            table=Table(
                (Column("Description", width=3), Column("Credits", amount=True), Column("Amount (USD)", amount=True)),
                [(f"Receipt {doc['voids']} voided", -doc["credits"], -doc["amount_usd"])],
            ),
            totals=(("Total credited (USD)", -doc["amount_usd"]),),
            notes=(f"This credit note cancels receipt {doc['voids']}, which stays on record.",),
            footer=footer,
        )
    payment = doc["payment"]
    facts = [("Date", issued)]
    if payment.get("order_id"):
        facts.append(("Order", payment["order_id"]))
    if payment.get("reference"):
        facts.append(("Payment reference", payment["reference"]))
    if payment.get("amount_paid") is not None:
        facts.append(("Amount paid", _paid(payment)))
    void = doc.get("void")
    if void:
        facts.append(("Voided", f"by credit note {void['credit_note']}: {void['reason']}"))
    return Document(
        operator=doc["issuer"]["name"],
        title=f"Receipt {doc['_id']}",
        badge="VOID" if void else "",
        parties=parties,
        facts=facts,
        table=Table(
            (Column("Description", width=3), Column("Credits", amount=True), Column("Amount (USD)", amount=True)),
            [
                (
                    f"{METHODS.get(payment['method'], payment['method'])}: prepaid API credits",
                    doc["credits"],
                    doc["amount_usd"],
                )
            ],
        ),
        totals=(("Total paid (USD)", doc["amount_usd"]), ("Credits applied", doc["credits"])),
        notes=("Prepaid credits for the API, paid in full. No tax is charged on this receipt.",),
        footer=footer,
    )


def email_text(doc: dict) -> str:
    issuer = doc["issuer"]["name"]
    if doc["kind"] == "credit_note":
        return (
            f"Credit note {doc['_id']} from {issuer} cancels receipt {doc['voids']}: {doc['reason']}\n\n"
            f"Amount: {amount(doc['amount_usd'])} USD, {amount(doc['credits'])} credits.\n"
            "The PDF is attached.\n"
        )
    return (
        f"Receipt {doc['_id']} from {issuer}\n\n"
        f"Paid: {amount(doc['amount_usd'])} USD ({_paid(doc['payment'])})\n"
        f"Credits applied: {amount(doc['credits'])}\n\n"
        "The PDF is attached; your receipts are also in the portal under Billing.\n"
    )
