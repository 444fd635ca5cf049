"""The billing area's part of the OpenAPI document (crypto top-ups, billing details, receipts, monthly statements): its
operations (each with its least role) and schemas, the request bodies being the very `Field` declarations
handlers/billing/handlers.py validates with."""

from handlers.billing import documents, statements
from handlers.billing import handlers as billing
from handlers.openapi_operations import Operation
from handlers.openapi_schema import TIME, B, I, N, S, array, body_schema, nullable, obj, path_param, query_param, ref
from security import roles

BILLING = "/billing/crypto"

OPERATIONS: list[Operation] = [
    Operation(
        "get",
        f"{BILLING}/config",
        "Accepted currencies with their minimum order (public)",
        "billing",
        ref("BillingConfig"),
        security=None,
        errors=(),
    ),
    Operation(
        "post",
        f"{BILLING}/checkout",
        "Create a top-up order; returns the payment address",
        "billing",
        ref("Order"),
        body="Checkout",
        errors=(401, 413, 422, 429, 502, 503),
        idempotent=True,
        role=roles.BILLING,
        links={"GetOrder": ("get_billing_crypto_orders_order_id", "order_id")},
    ),
    Operation(
        "get",
        f"{BILLING}/orders",
        "The account's orders, newest first",
        "billing",
        array(ref("Order")),
        params=(query_param(billing.ORDERS_LIMIT),),
        errors=(401, 422),
        role=roles.VIEWER,
    ),
    Operation(
        "get",
        f"{BILLING}/orders/{{order_id}}",
        "One order with amounts received and credits applied",
        "billing",
        ref("Order"),
        params=(path_param("order_id", S),),
        errors=(401, 404),
        role=roles.VIEWER,
    ),
    Operation(
        "get",
        f"{BILLING}/orders/{{order_id}}/qr",
        "A QR code (SVG) of the order's payment_uri",
        "billing",
        {"type": "string"},
        params=(path_param("order_id", S),),
        errors=(401, 404),
        media="image/svg+xml",
        role=roles.VIEWER,
    ),
    Operation(
        "post",
        f"{BILLING}/ipn",
        "The payment processor's signed notification",
        "billing",
        obj(("status",), status={"enum": ["ok", "ignored"]}),
        security=None,
        params=(
            {
                "name": "x-nowpayments-sig",
                "in": "header",
                "required": True,
                "schema": S,
                "description": "Hex HMAC-SHA512 of the sorted JSON body",
            },
        ),
        body=None,
        errors=(401, 503),
    ),
    Operation(
        "post",
        f"{BILLING}/sandbox/pay",
        "Send a simulated payment to an order (development only)",
        "billing",
        obj(("tx", "order"), tx={"type": "object"}, order=ref("Order")),
        body="SandboxPay",
        errors=(401, 404, 409, 413, 422),
        role=roles.BILLING,
    ),
    Operation(
        "post",
        f"{BILLING}/sandbox/confirm",
        "Confirm an order's pending simulated payments (development only)",
        "billing",
        obj(("confirmed_payments", "order"), confirmed_payments=I, order=ref("Order")),
        body="SandboxConfirm",
        errors=(401, 404, 409, 413, 422),
        role=roles.BILLING,
    ),
]

NUMBER = path_param("number", {"type": "string", "pattern": documents.NUMBER.pattern}, "R-2026-000123")
_PDF = {
    "also": ("application/pdf",),
    "headers": {"Content-Disposition": {"schema": S, "description": 'with PDF: attachment; filename="<number>.pdf"'}},
}
OPERATIONS += [
    Operation(
        "get",
        "/billing/details",
        "The account's billing details: who receipts are issued to, and where they are emailed",
        "billing",
        ref("BillingDetails"),
        errors=(401, 403),
        role=roles.BILLING,
    ),
    Operation(
        "put",
        "/billing/details",
        "Set the account's billing details (whole: a field left out is cleared); issued documents keep theirs",
        "billing",
        ref("BillingDetails"),
        body="BillingDetailsIn",
        errors=(401, 403, 413, 422),
        role=roles.BILLING,
    ),
    Operation(
        "get",
        "/billing/receipts",
        "The account's receipts, newest first: one for every settled payment",
        "billing",
        array(ref("Receipt")),
        params=(query_param(documents.RECEIPTS_LIMIT),),
        errors=(401, 403, 422),
        role=roles.BILLING,
    ),
    Operation(
        "get",
        "/billing/receipts/{number}",
        "One receipt as JSON, or as PDF with Accept: application/pdf",
        "billing",
        ref("Receipt"),
        params=(NUMBER, query_param(documents.PAPER)),
        errors=(401, 403, 404, 422),
        role=roles.BILLING,
        **_PDF,
    ),
    Operation(
        "get",
        "/billing/credit-notes/{number}",
        "One credit note (a voided receipt's) as JSON, or as PDF with Accept: application/pdf",
        "billing",
        ref("CreditNote"),
        params=(NUMBER, query_param(documents.PAPER)),
        errors=(401, 403, 404, 422),
        role=roles.BILLING,
        **_PDF,
    ),
]

_DETAILS = {name: S for name in ("legal_name", "address", "country", "tax_id", "email")}
_DOCUMENT = dict(
    number=S,
    kind={"enum": ["receipt", "credit_note"]},
    issued_at=TIME,
    account_id=S,
    issuer=obj(("name",), name=S, address=S, tax_id=S, footer=S),
    customer=obj((), **_DETAILS),
    amount_usd=N,
    credits=I,
)
STATEMENT_MONTH = path_param(
    "month",
    {"type": "string", "pattern": "^[0-9]{4}-(0[1-9]|1[0-2])$"},
    "A calendar month (UTC) as yyyy-mm, from the account's first to the current one (422 otherwise)",
)
OPERATIONS += [
    Operation(
        "get",
        "/billing/statements",
        "The months with a statement, newest first: the current month is the statement so far",
        "billing",
        ref("StatementMonths"),
        errors=(401,),
        role=roles.BILLING,
    ),
    Operation(
        "get",
        "/billing/statements/{month}",
        "A monthly statement: opening balance, credits added, usage by endpoint, closing balance. "
        "`Accept: application/pdf` or `text/csv` for the document",
        "billing",
        ref("Statement"),
        params=(STATEMENT_MONTH, query_param(documents.PAPER)),
        errors=(401, 422),
        also=(
            (statements.PDF, {"type": "string", "format": "binary"}),
            (statements.CSV, {"type": "string", "description": "One row per entry, then the totals"}),
        ),
        headers={
            "Content-Disposition": {
                "schema": S,
                "description": 'PDF and CSV: attachment; filename="statement-<yyyy-mm>.<pdf|csv>"',
            }
        },
        role=roles.BILLING,
    ),
]

SCHEMAS: dict = {
    "BillingDetails": obj(tuple(_DETAILS), **_DETAILS, updated_at=nullable(TIME)),
    "BillingDetailsIn": body_schema(documents.DETAILS),
    "Receipt": obj(
        ("number", "issued_at", "amount_usd", "credits", "method"),
        **_DOCUMENT,
        method={"enum": ["crypto", "admin"]},
        order_id=nullable(S),
        currency=nullable(S),
        amount_paid=nullable(N),
        payment_reference=nullable(S),
        void=nullable(obj(("credit_note", "reason", "voided_at"), credit_note=S, reason=S, voided_at=TIME)),
    ),
    "CreditNote": obj(("number", "issued_at", "voids", "reason"), **_DOCUMENT, voids=S, reason=S),
    "Currency": obj(("code", "min_usd"), code=S, name=S, network=S, min_usd=N),
    "BillingConfig": obj(("currencies",), currencies=array(ref("Currency")), credits_per_usd=I),
    "Checkout": body_schema(billing.CHECKOUT),
    "Amount": obj(("amount", "usd"), amount=N, usd=N),
    "Order": obj(
        ("order_id", "status", "credits_applied"),
        order_id=S,
        status=S,
        pay_address=S,
        pay_currency=S,
        pay_amount=N,
        payment_uri={"type": "string", "description": "network:address?amount=coins, what a wallet scans"},
        price_usd=N,
        credits_expected=I,
        created_at=TIME,
        expires_at=TIME,
        updated_at=TIME,
        amount_received=ref("Amount"),
        amount_confirmed=ref("Amount"),
        credits_applied=I,
    ),
    "StatementMonths": obj(
        ("months",), months=array(obj(("month", "status"), month=S, status={"enum": ["final", "so_far"]}))
    ),
    "StatementAddition": obj(
        ("at", "kind", "description", "credits"),
        at=TIME,
        kind={
            "enum": ["signup", "credit", "payment", "admin_credit", "admin_debit", "unpaid", "brought_forward"],
        },
        description=S,
        credits={**I, "description": "Negative for a debit"},
        order_id=S,
        receipt={**S, "description": "The top-up's receipt number"},
    ),
    "StatementUsage": obj(
        ("endpoint", "calls", "credits", "cached_calls", "credits_saved"),
        endpoint=S,
        calls=I,
        credits=I,
        cached_calls=I,
        credits_saved=I,
    ),
    "Statement": obj(
        (
            "month",
            "status",
            "period_start",
            "period_end",
            "opening_balance",
            "credits_added",
            "credits_charged",
            "credits_saved",
            "closing_balance",
            "calls",
            "additions",
            "usage",
            "reconciled",
        ),
        month=S,
        status={"enum": ["final", "so_far"]},
        period_start=TIME,
        period_end={**TIME, "description": "Exclusive: the next month's start"},
        opening_balance=I,
        credits_added=I,
        credits_charged=I,
        credits_saved=I,
        closing_balance={**I, "description": "opening_balance + credits_added - credits_charged"},
        calls=I,
        additions=array(ref("StatementAddition")),
        usage=array(ref("StatementUsage")),
        reconciled={
            **B,
            "description": "The books agree: credits added = balance + charged usage, as the reconcile command checks",
        },
    ),
    "SandboxPay": body_schema(billing.SANDBOX_PAY),
    "SandboxConfirm": body_schema(billing.SANDBOX_CONFIRM),
}
