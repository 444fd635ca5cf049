"""`social-gateway sandbox-pay` / `sandbox-confirm`: the sandbox chain from a terminal.

Runs the same path as POST /billing/crypto/sandbox/pay against the database in
MONGODB_URI. The credits land in MongoDB at once; a running server's cached plan
for the account refreshes within KEY_CACHE_TTL (its own sandbox endpoint updates it at once).
"""
import argparse
import asyncio
import sys

import orjson

import config
from payments.sandbox_chain import SandboxRefused
from payments.service import build_payments, view
from storage import db as database
from storage.accounts import AccountStore

HELP = ("Development only. MONGODB_URI must name the running gateway's database: with the embedded default, "
        "copy the URI `social-gateway serve` prints at start-up (mongodb://127.0.0.1:PORT/...).")


def add_commands(commands: argparse._SubParsersAction) -> None:
    pay = commands.add_parser("sandbox-pay", help="send a sandbox-chain payment to an order", description=HELP)
    pay.add_argument("order_id")
    pay.add_argument("amount_usd", type=float, help="what the payment is worth in USD at the order's quote")
    pay.add_argument("--unconfirmed", action="store_true", help="leave it unconfirmed until sandbox-confirm")
    confirm = commands.add_parser("sandbox-confirm", help="confirm an order's pending sandbox payments",
                                  description=HELP)
    confirm.add_argument("order_id")


async def _run(settings: config.Settings, args: argparse.Namespace) -> dict:
    client = database.connect(settings.mongodb_uri)
    try:
        db = client[settings.mongodb_db]
        payments = await build_payments(settings, db, AccountStore(db).apply_credit)
        order = await payments.orders.get(args.order_id)
        if order is None or order["provider"] != "sandbox":
            raise SandboxRefused(f"No sandbox order {args.order_id} in {settings.mongodb_db}")
        if args.command == "sandbox-pay":
            if not 0 < args.amount_usd <= 1_000_000:
                raise SandboxRefused("amount_usd must be above 0 and at most 1000000")
            tx, order = await payments.sandbox_pay(order, round(args.amount_usd, 2), not args.unconfirmed)
            return {"tx": tx, "order": view(order)}
        confirmed, order = await payments.sandbox_confirm(order)
        return {"confirmed_payments": confirmed, "order": view(order)}
    finally:
        await client.close()


def run(args: argparse.Namespace) -> int:
    settings = config.load_for_command()
    if settings is None:
        return 2
    if settings.production or settings.payments_provider or not settings.mongodb_uri:
        print(f"social-gateway: the sandbox chain needs a development server without PAYMENTS_PROVIDER. {HELP}",
              file=sys.stderr)
        return 2
    try:
        result = asyncio.run(_run(settings, args))
    except SandboxRefused as exc:
        print(f"social-gateway: {exc}", file=sys.stderr)
        return 1
    print(orjson.dumps(result, option=orjson.OPT_INDENT_2 | orjson.OPT_NAIVE_UTC).decode())
    return 0
