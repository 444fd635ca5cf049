"""`social-gateway admin grant|revoke|credit`: admin rights and development credits from a terminal.

Connects to MONGODB_URI (and MONGODB_DB), or, when MONGODB_URI is unset, starts the
embedded database on DATA_DIR/db. Two processes cannot open one embedded data
directory: stop the service first, or point MONGODB_URI at the server it uses.
A grant or revoke applies to the next request; a running gateway picks up credits
through its coherence feed (at most KEY_CACHE_TTL later).
"""
import argparse
import asyncio
import os
import sys

import config
from storage import db as database
from storage.accounts import AccountStore
from storage.embedded import EmbeddedMongo

MAX_CREDITS = 10**12


def add_commands(commands: argparse._SubParsersAction) -> None:
    admin = commands.add_parser("admin", help="grant or revoke admin rights; credit an account (development)",
                                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = admin.add_subparsers(dest="action", required=True)
    actions.add_parser("grant", help="make the account an admin").add_argument("email")
    actions.add_parser("revoke", help="take the account's admin flag away").add_argument("email")
    credit = actions.add_parser("credit", help="add credits to the account (refused in production)")
    credit.add_argument("email")
    credit.add_argument("credits", type=int)


async def _apply(settings: config.Settings, uri: str, args: argparse.Namespace) -> str | None:
    """The message to print, or None when no account has that email."""
    client = database.connect(uri)
    try:
        accounts = AccountStore(client[settings.mongodb_db])
        email = args.email.strip().lower()
        if args.action in ("grant", "revoke"):
            if not await accounts.set_admin(email, args.action == "grant"):
                return None
            return f"{email} is {'now' if args.action == 'grant' else 'no longer'} an admin" + \
                (" (it stays one while listed in ADMIN_EMAILS)" if email in settings.admin_emails else "")
        account = await accounts.by_email(email)
        if account is None:
            return None
        # Like the development top-up endpoint: the credits also count towards the plan.
        doc = await accounts.add_credits(account["_id"], args.credits, topup_credits=args.credits)
        return f"{email}: {args.credits} credits added; unleased balance {doc['credits']}"
    finally:
        await client.close()


def run(args: argparse.Namespace) -> int:
    settings = config.load_for_command()
    if settings is None:
        return 2
    if args.action == "credit":
        if settings.production:
            print("social-gateway: admin credit is refused in production: credits come only from settled payments",
                  file=sys.stderr)
            return 2
        if not 0 < args.credits <= MAX_CREDITS:
            print(f"social-gateway: credits must be between 1 and {MAX_CREDITS}", file=sys.stderr)
            return 2
    embedded, uri = None, settings.mongodb_uri
    if not uri:
        try:
            embedded = EmbeddedMongo(os.path.join(settings.data_dir, "db")).start()
        except RuntimeError:
            print("social-gateway: cannot open the embedded database in DATA_DIR/db; if the service is running, "
                  "stop it first or set MONGODB_URI to the database it uses", file=sys.stderr)
            return 2
        uri = embedded.uri
    try:
        message = asyncio.run(_apply(settings, uri, args))
    finally:
        if embedded:
            embedded.stop()
    if message is None:
        print(f"social-gateway: no account with the email {args.email}", file=sys.stderr)
        return 1
    print(message)
    return 0
