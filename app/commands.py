"""Every sub-command of `social-gateway` besides serve: `admin grant|revoke|credit`, `sandbox-pay`,
`sandbox-confirm` (the sandbox chain from a terminal), `simulate-upstream`, and the operations commands
`backup`, `restore`, `migrate` and `reconcile` (app/operations.py)."""

import argparse
import asyncio
import sys

import orjson

import config
import sandbox
from app import operations
from app.embedded import DataDirBusy, start_helpers
from handlers.base import dumps
from handlers.billing.handlers import AMOUNT_USD
from handlers.keys.handlers import CREDITS
from payments.sandbox_chain import SandboxRefused
from payments.service import build_payments, view
from storage import db as database
from storage.accounts import AccountStore

ADMIN_HELP = """\
admin connects to MONGODB_URI (and MONGODB_DB), or, when MONGODB_URI is unset, starts the
embedded database on DATA_DIR/db. Two processes cannot open one embedded data
directory: stop the service first, or point MONGODB_URI at the server it uses.
A grant or revoke applies to the next request; a running gateway picks up credits
through its coherence feed (at most KEY_CACHE_TTL later).
"""


def add_commands(commands: argparse._SubParsersAction) -> None:
    sandbox.add_arguments(
        commands.add_parser(
            "simulate-upstream",
            help="run the sandbox upstream provider",
            description="Serve the sandbox upstream: a deterministic simulated social-data provider.",
        )
    )
    admin = commands.add_parser(
        "admin",
        help="grant or revoke admin rights; credit an account (development)",
        description=ADMIN_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = admin.add_subparsers(dest="action", required=True)
    actions.add_parser("grant", help="make the account an admin").add_argument("email")
    actions.add_parser("revoke", help="take the account's admin flag away").add_argument("email")
    credit = actions.add_parser("credit", help="add credits to the account (refused in production)")
    credit.add_argument("email")
    credit.add_argument("credits", type=int)
    _add_sandbox_chain(commands)
    operations.add_commands(commands)


async def _apply(settings: config.Settings, uri: str, args: argparse.Namespace) -> str | None:
    """The message to print, or None when no account has that email."""
    client = database.connect(uri)
    try:
        accounts = AccountStore(client[settings.mongodb_db])
        email = args.email.strip().lower()
        if args.action in ("grant", "revoke"):
            if not await accounts.set_admin(email, args.action == "grant"):
                return None
            return f"{email} is {'now' if args.action == 'grant' else 'no longer'} an admin"
        account = await accounts.by_email(email)
        if account is None:
            return None
        # Like the development top-up endpoint: the credits also count towards the plan.
        doc = await accounts.add_credits(account["_id"], args.credits, topup_credits=args.credits)
        return f"{email}: {args.credits} credits added; unleased balance {doc['credits']}"
    finally:
        await client.close()


def run_admin(args: argparse.Namespace) -> int:
    settings = config.load_for_command()
    if settings is None:
        return 2
    if args.action == "credit":
        if settings.production:
            print(
                "social-gateway: admin credit is refused in production: credits come only from settled payments",
                file=sys.stderr,
            )
            return 2
        # The bounds of the development top-up endpoint (handlers/keys/handlers.py).
        if not CREDITS.minimum <= args.credits <= CREDITS.maximum:
            print(f"social-gateway: credits must be between {CREDITS.minimum} and {CREDITS.maximum}", file=sys.stderr)
            return 2
    try:
        helpers = start_helpers(settings, sandbox=False)
    except DataDirBusy as exc:
        print(
            f"social-gateway: {exc}: stop it first, or set MONGODB_URI to the database it uses "
            "(serve prints it at start-up)",
            file=sys.stderr,
        )
        return 2
    except RuntimeError:
        print(
            "social-gateway: cannot open the embedded database in DATA_DIR/db; if the service is running, "
            "stop it first or set MONGODB_URI to the database it uses",
            file=sys.stderr,
        )
        return 2
    try:
        message = asyncio.run(_apply(settings, helpers.settings.mongodb_uri, args))
    finally:
        helpers.stop()
    if message is None:
        print(f"social-gateway: no account with the email {args.email}", file=sys.stderr)
        return 1
    print(message)
    return 0


# --- sandbox-pay / sandbox-confirm ------------------------------------------------------------------
HELP = (
    "Development only. MONGODB_URI must name the running gateway's database: with the embedded default, "
    "copy the URI `social-gateway serve` prints at start-up (mongodb://127.0.0.1:PORT/...)."
)


def _add_sandbox_chain(commands: argparse._SubParsersAction) -> None:
    pay = commands.add_parser("sandbox-pay", help="send a sandbox-chain payment to an order", description=HELP)
    pay.add_argument("order_id")
    pay.add_argument("amount_usd", type=float, help="what the payment is worth in USD at the order's quote")
    pay.add_argument("--unconfirmed", action="store_true", help="leave it unconfirmed until sandbox-confirm")
    confirm = commands.add_parser(
        "sandbox-confirm", help="confirm an order's pending sandbox payments", description=HELP
    )
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
            # The endpoint's bounds (handlers/billing/handlers.py).
            low, high = AMOUNT_USD.exclusive_minimum, AMOUNT_USD.maximum
            if not low < args.amount_usd <= high:
                raise SandboxRefused(f"amount_usd must be above {low} and at most {high}")
            tx, order = await payments.sandbox_pay(order, round(args.amount_usd, 2), not args.unconfirmed)
            return {"tx": tx, "order": view(order)}
        confirmed, order = await payments.sandbox_confirm(order)
        return {"confirmed_payments": confirmed, "order": view(order)}
    finally:
        await client.close()


def run_sandbox_chain(args: argparse.Namespace) -> int:
    settings = config.load_for_command()
    if settings is None:
        return 2
    if settings.production or settings.payments_provider or not settings.mongodb_uri:
        print(
            f"social-gateway: the sandbox chain needs a development server without PAYMENTS_PROVIDER. {HELP}",
            file=sys.stderr,
        )
        return 2
    try:
        result = asyncio.run(_run(settings, args))
    except SandboxRefused as exc:
        print(f"social-gateway: {exc}", file=sys.stderr)
        return 1
    print(dumps(result, orjson.OPT_INDENT_2).decode())  # the timestamps of the HTTP answers
    return 0


def run(args: argparse.Namespace) -> int:
    """Runs the sub-command `args.command` (anything but serve)."""
    if args.command == "simulate-upstream":
        return sandbox.run(args)
    if args.command in ("sandbox-pay", "sandbox-confirm"):
        return run_sandbox_chain(args)
    if args.command in operations.COMMANDS:
        return operations.run(args)
    return run_admin(args)
