"""An invitation and its person in a real browser, at a desktop's 1280×800 and a phone's 390×844 (issue 47, items 4
and 5): the link shows who invites whom to which account with which role, signed out and signed in ("Join … as
…", no "Log in or create an account"), and says it is joining while it joins; a member removed from every account
starts an account of their own from the login form. Each fails on a page wider than the screen. The browser
helpers are tests/portal/test_browser.py's; this module runs its own gateway."""

import uuid

import pytest
import test_browser
from test_browser import PASSWORD, expect, shot
from test_browser_security import SIZES, fits, opened, sign_in

from gateway_testing.stack import Stack

pytestmark = test_browser.pytestmark  # skipped, with the reason, without Chromium
browser, watched = test_browser.browser, test_browser.watched  # the same fixtures, on this module's stack
THEIRS = "the newcomer's own passphrase"


@pytest.fixture(scope="module")
def stack():
    env = {
        "SIGNUP_CREDITS": str(test_browser.SIGNUP_CREDITS),
        "SIGNUP_CREDITED_PER_NETWORK": "1000000",
        "CACHE_MAX_BYTES": "0",
    }
    with Stack(in_memory=True, gateway_env=env) as running:
        yield running


def address(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}@example.com"


def invitation(stack, owner: dict, email: str, role: str) -> str:
    status, made, _ = stack.call("POST", "/members/invitations", {"email": email, "role": role}, token=owner["token"])
    assert status == 200, made
    return made["token"]


def held_writes(page, pattern: str) -> list:
    """Holds every POST matching `pattern` until the test lets it go (`route.continue_()`)."""
    held: list = []
    page.route(pattern, lambda route: held.append(route) if route.request.method == "POST" else route.continue_())
    return held


def let_go(page, held: list) -> None:
    for _ in range(400):
        if held:
            held.pop(0).continue_()
            return
        page.wait_for_timeout(50)
    raise AssertionError("the page did not send the request")


@pytest.mark.parametrize("size", SIZES)
def test_the_link_says_who_invites_whom_where_and_shows_the_join_under_way(watched, stack, size, tmp_path):
    owner = stack.account(address("owner"), PASSWORD)
    newcomer = address("new")
    token = invitation(stack, owner, newcomer, "billing")
    w = opened(watched, size)
    page = w.page
    page.goto(f"{stack.url}/#invitation={token}")
    expect(page.get_by_test_id("accept-title")).to_have_text(f"Join the account of {owner['email']} as billing")
    expect(page.locator("#auth-title")).to_have_text("You are invited")
    expect(page.get_by_test_id("accept-inviter")).to_have_text(owner["email"])
    expect(page.get_by_test_id("accept-role")).to_have_text("billing")
    expect(page.get_by_test_id("accept-email")).to_have_text(newcomer)
    expect(page.get_by_test_id("accept-account")).to_have_text(owner["email"])
    fits(page, size)
    shot(page, tmp_path, f"invitation-{size}")

    held = held_writes(page, "**/portal/invitations/accept")
    page.get_by_test_id("accept-password").fill(THEIRS)
    page.get_by_test_id("accept-submit").click()
    progress = page.get_by_test_id("accept-progress")
    expect(progress).to_be_visible()  # while the password is hashed, the page says what it is doing
    expect(progress).to_contain_text("Joining")
    expect(page.get_by_test_id("accept-submit")).to_have_text("Joining…")
    expect(page.get_by_test_id("accept-submit")).to_be_disabled()
    fits(page, size)
    let_go(page, held)
    expect(page.get_by_test_id("logout")).to_be_visible()
    expect(page.get_by_test_id("who-role")).to_have_text("billing")
    w.check()


@pytest.mark.parametrize("size", SIZES)
def test_signed_in_the_link_offers_to_join_with_that_sign_in(watched, stack, size, tmp_path):
    owner = stack.account(address("owner"), PASSWORD)
    person = stack.account(address("member"), PASSWORD)
    token = invitation(stack, owner, person["email"], "viewer")
    w = opened(watched, size)
    page = w.page
    sign_in(page, stack, person["email"])
    expect(page.get_by_test_id("logout")).to_be_visible()
    page.goto(f"{stack.url}/#invitation={token}")
    join = f"Join the account of {owner['email']} as viewer"
    expect(page.get_by_test_id("accept-title")).to_have_text(join)
    expect(page.locator("#auth-title")).to_have_text("You are invited")  # not "Log in or create an account"
    expect(page.get_by_test_id("accept-signed-in")).to_have_text(f"You are signed in as {person['email']}.")
    expect(page.get_by_test_id("accept-password")).to_be_hidden()
    expect(page.get_by_test_id("accept-submit")).to_have_text(join)
    fits(page, size)
    shot(page, tmp_path, f"invitation-signed-in-{size}")
    page.get_by_test_id("accept-submit").click()
    expect(page.get_by_test_id("who-role")).to_have_text("viewer")
    expect(page.get_by_test_id("account-picker").locator("option")).to_have_count(2)
    w.check()


@pytest.mark.parametrize("size", SIZES)
def test_a_member_removed_from_every_account_starts_one_of_their_own(watched, stack, size, tmp_path):
    owner = stack.account(address("owner"), PASSWORD)
    newcomer = address("gone")
    token = invitation(stack, owner, newcomer, "developer")
    status, joined, _ = stack.call("POST", "/auth/invitations/accept", {"token": token, "password": THEIRS})
    assert status == 200, joined
    members = stack.call("GET", "/members", token=owner["token"])[1]
    member = next(m["member_id"] for m in members if m["email"] == newcomer)
    assert stack.call("DELETE", f"/members/{member}", token=owner["token"])[0] == 200

    w = opened(watched, size)
    page = w.page
    sign_in(page, stack, newcomer, THEIRS)
    expect(page.get_by_test_id("error").first).to_contain_text("start an account of your own")
    expect(page.get_by_test_id("own-account")).to_be_visible()
    fits(page, size)
    shot(page, tmp_path, f"removed-{size}")
    page.get_by_test_id("own-account").click()
    expect(page.get_by_test_id("logout")).to_be_visible()
    expect(page.get_by_test_id("who-role")).to_have_text("owner")
    expect(page.get_by_test_id("balance")).to_have_text(f"{test_browser.SIGNUP_CREDITS:,} credits")
    page.goto(stack.url + "/#members")
    expect(page.get_by_test_id("member")).to_have_count(1)
    expect(page.get_by_test_id("member")).to_contain_text(newcomer)
    fits(page, size)
    w.check(allowed_errors="403")
