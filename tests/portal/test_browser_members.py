"""Teams in a real browser, at a desktop's 1280×800 and a phone's 390×844 (issue 37): an owner invites a developer
from the Members view, the developer joins through the link with a password of their own, sees what their role
cannot do disabled with the reason, is demoted and then removed (locked out at their next page load); a person
in two accounts switches between them with the account picker. Each step fails on a page wider than the screen.
The browser helpers are tests/portal/test_browser.py's; this module runs its own gateway."""

import re
import uuid

import pytest
import test_browser
from test_browser import PASSWORD, expect, register, shot
from test_browser_security import SIZES, fits, opened, sign_in

from gateway_testing.stack import Stack

pytestmark = test_browser.pytestmark  # skipped, with the reason, without Chromium
browser, watched = test_browser.browser, test_browser.watched  # the same fixtures, on this module's stack
THEIRS = "the developer's own passphrase"


@pytest.fixture(scope="module")
def stack():
    env = {
        "SIGNUP_CREDITS": str(test_browser.SIGNUP_CREDITS),  # what test_browser.register expects to see
        "SIGNUP_CREDITED_PER_NETWORK": "1000000",
        "CACHE_MAX_BYTES": "0",
    }
    with Stack(in_memory=True, gateway_env=env) as running:
        yield running


def members_view(page, stack) -> None:
    page.goto(stack.url + "/#members")
    expect(page.locator("#view-members")).to_be_visible()


@pytest.mark.parametrize("size", SIZES)
def test_invite_join_see_what_the_role_cannot_do_demote_and_remove(watched, stack, size, tmp_path):
    w = opened(watched, size)
    owner = w.page
    register(owner, stack)
    members_view(owner, stack)
    expect(owner.get_by_test_id("member")).to_have_count(1)
    expect(owner.get_by_test_id("member")).to_contain_text("owner")
    newcomer = f"dev-{uuid.uuid4().hex[:8]}@example.com"
    owner.get_by_test_id("invite-email").fill(newcomer)
    owner.get_by_test_id("invite-role").select_option("developer")
    owner.get_by_test_id("invite-submit").click()
    link = owner.get_by_test_id("invitation-link")
    expect(link).to_be_visible()
    expect(owner.get_by_test_id("invitation")).to_have_count(1)
    expect(owner.get_by_test_id("invitation")).to_contain_text(newcomer)
    fits(owner, size)
    shot(owner, tmp_path, f"members-invited-{size}")

    # The newcomer opens the link in their own browser and makes their sign-in.
    d = opened(watched, size)
    dev = d.page
    dev.goto(link.get_attribute("href"))
    expect(dev.get_by_test_id("accept-submit")).to_be_visible()
    assert "invitation=" not in dev.url  # the token leaves the address bar at once
    dev.get_by_test_id("accept-password").fill(THEIRS)
    dev.get_by_test_id("accept-submit").click()
    expect(dev.get_by_test_id("logout")).to_be_visible()
    expect(dev.get_by_test_id("who-role")).to_have_text("developer")
    dev.goto(stack.url + "/#keys")
    expect(dev.get_by_test_id("create-key")).to_be_enabled()
    dev.goto(stack.url + "/#billing")
    expect(dev.get_by_test_id("checkout-submit")).to_be_disabled()
    reason = "Your role in this account is developer: this needs owner, admin, billing."
    expect(dev.locator("#checkout-form").get_by_test_id("role-note")).to_have_text(reason)
    members_view(dev, stack)
    expect(dev.get_by_test_id("member")).to_have_count(2)
    expect(dev.get_by_test_id("invite-submit")).to_be_disabled()
    expect(dev.get_by_test_id("member-role")).to_have_count(0)  # no role to change from here
    fits(dev, size)
    shot(dev, tmp_path, f"members-as-developer-{size}")

    # The owner makes them a viewer: from their next page load, keys cannot be made.
    members_view(owner, stack)
    owner.reload()
    row = owner.get_by_test_id("member").filter(has_text=newcomer)
    row.get_by_test_id("member-role").select_option("viewer")
    expect(row.get_by_test_id("member-role")).to_be_enabled()  # the change answered
    dev.reload()
    expect(dev.get_by_test_id("who-role")).to_have_text("viewer")
    dev.goto(stack.url + "/#keys")
    expect(dev.get_by_test_id("create-key")).to_be_disabled()
    expect(dev.locator("#key-form").get_by_test_id("role-note")).to_have_text(
        re.compile("^Your role in this account is viewer: this needs owner, admin, developer")
    )
    fits(dev, size)

    # Removed: the next page load signs them out; the owner's list is theirs alone again.
    row.get_by_test_id("remove-member").click()
    owner.get_by_test_id("confirm").click()
    expect(owner.get_by_test_id("member")).to_have_count(1)
    dev.reload()
    expect(dev.get_by_test_id("login")).to_be_visible()
    sign_in(dev, stack, newcomer, THEIRS)
    expect(dev.get_by_test_id("error").first).to_contain_text("not a member of any account")
    w.check()
    d.check(allowed_errors="403")


@pytest.mark.parametrize("size", SIZES)
def test_a_person_in_two_accounts_picks_one(watched, stack, size, tmp_path):
    theirs = stack.account(f"owner-{uuid.uuid4().hex[:8]}@example.com", PASSWORD)
    mine = stack.account(f"me-{uuid.uuid4().hex[:8]}@example.com", PASSWORD)
    status, invitation, _ = stack.call(
        "POST", "/members/invitations", {"email": mine["email"], "role": "billing"}, token=theirs["token"]
    )
    assert status == 200
    status, _, _ = stack.call("POST", "/auth/invitations/accept", {"token": invitation["token"]}, token=mine["token"])
    assert status == 200
    w = opened(watched, size)
    page = w.page
    sign_in(page, stack, mine["email"])
    picker = page.get_by_test_id("account-picker")
    expect(picker).to_be_visible()
    expect(page.get_by_test_id("who-role")).to_have_text("owner")  # a login opens the person's own account
    expect(picker.locator("option")).to_have_count(2)
    fits(page, size)
    picker.select_option(theirs["account_id"])
    expect(page.get_by_test_id("who-role")).to_have_text("billing")
    page.goto(stack.url + "/#keys")
    expect(page.get_by_test_id("create-key")).to_be_disabled()
    page.goto(stack.url + "/#billing")
    expect(page.get_by_test_id("checkout-submit")).to_be_enabled()
    fits(page, size)
    shot(page, tmp_path, f"picker-{size}")
    page.get_by_test_id("account-picker").select_option(mine["account_id"])
    expect(page.get_by_test_id("who-role")).to_have_text("owner")
    w.check()


def test_a_slow_first_invitations_list_does_not_hide_an_invitation_just_made(watched, stack):
    w = watched()
    owner = w.page
    register(owner, stack)
    held = test_browser.hold_first(owner, "**/members/invitations")
    members_view(owner, stack)
    first = test_browser.wait_held(owner, held, "/members/invitations")
    owner.get_by_test_id("invite-email").fill(f"late-{uuid.uuid4().hex[:8]}@example.com")
    owner.get_by_test_id("invite-submit").click()
    invitations = owner.get_by_test_id("invitation")
    expect(invitations).to_have_count(1)
    test_browser.release_late(owner, first)
    expect(invitations).to_have_count(1)
    w.check()


def test_a_slow_members_list_does_not_bring_back_a_member_just_removed(watched, stack):
    w = watched()
    owner = w.page
    email = register(owner, stack)
    _, session, _ = stack.call("POST", "/auth/login", {"email": email, "password": PASSWORD})
    newcomer = f"gone-{uuid.uuid4().hex[:8]}@example.com"
    status, invitation, _ = stack.call(
        "POST", "/members/invitations", {"email": newcomer, "role": "developer"}, token=session["token"]
    )
    assert status == 200, invitation
    status, body, _ = stack.call("POST", "/auth/invitations/accept", {"token": invitation["token"], "password": THEIRS})
    assert status == 200, body
    members_view(owner, stack)
    members = owner.get_by_test_id("member")
    expect(members).to_have_count(2)
    owner.get_by_role("link", name="Overview").click()
    held = test_browser.hold_first(owner, "**/members")  # both members
    owner.get_by_role("link", name="Members").click()  # the rows drawn by the earlier visit stay usable
    first = test_browser.wait_held(owner, held, "/members")
    members.filter(has_text=newcomer).get_by_test_id("remove-member").click()
    owner.get_by_test_id("confirm").click()
    expect(members).to_have_count(1)
    test_browser.release_late(owner, first)
    expect(members).to_have_count(1)
    w.check()
