"""The portal's header, Activity's "By", the page's start, members, recovery codes and /docs in a real browser, at a
desktop's 1280×800 and a phone's 390×844 (issue 47, portal items 1, 2, 3 and 6): which account a person in two is
in (its name, their email and role, readable on the dark header, the email whole), who did what in a shared
account, a page that starts at the top with the navigation and the zero-balance warning in view, no "Leave" for
the last owner, recovery codes copied and downloaded, and a /docs whose Authorize dialog offers customers their
own credentials only. The browser helpers are tests/portal/test_browser.py's; this module runs its own gateway,
whose new accounts start with a zero balance (the red warning on every view)."""

import re
import uuid

import pyotp
import pytest
import test_browser
from test_browser import PASSWORD, expect, shot
from test_browser_security import SIZES, fits, opened, sign_in

from gateway_testing.stack import Stack
from services.audit import ACTIONS

pytestmark = test_browser.pytestmark  # skipped, with the reason, without Chromium
browser, watched = test_browser.browser, test_browser.watched  # the same fixtures, on this module's stack

# The contrast of a node's text with what is behind it (WCAG 2.x), the background being the first one found up the
# tree that is not transparent.
CONTRAST = """(node) => {
  const rgb = (c) => c.match(/[\\d.]+/g).map(Number);
  const lum = (c) => { const [r, g, b] = rgb(c).slice(0, 3).map((v) => { v /= 255;
    return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; }); return 0.2126 * r + 0.7152 * g + 0.0722 * b; };
  let back = node;
  while (back && (getComputedStyle(back).backgroundColor === "rgba(0, 0, 0, 0)" ||
                  getComputedStyle(back).backgroundColor === "transparent")) back = back.parentElement;
  const [a, b] = [lum(getComputedStyle(node).color), lum(back ? getComputedStyle(back).backgroundColor : "rgb(255,255,255)")];
  return (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
}"""
# How many lines a node's text takes.
LINES = """(node) => { const r = document.createRange(); r.selectNodeContents(node);
  return new Set([...r.getClientRects()].filter((x) => x.width > 0).map((x) => Math.round(x.top))).size; }"""


@pytest.fixture(scope="module")
def stack():
    with Stack(in_memory=True, gateway_env={"CACHE_MAX_BYTES": "0"}) as running:
        yield running


def address(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}@example.com"


def join(stack, owner: dict, role: str, person: dict | None = None) -> dict:
    """Invites a person into the owner's account and has them accept: an existing one with their session, a new one
    with a password of their own (then signed in with it)."""
    email = person["email"] if person else address(role)
    status, invitation, _ = stack.call("POST", "/members/invitations", {"email": email, "role": role}, owner["token"])
    assert status == 200, invitation
    accept = {"token": invitation["token"]} | ({} if person else {"password": PASSWORD})
    status, body, _ = stack.call("POST", "/auth/invitations/accept", accept, token=person and person["token"])
    assert status == 200, body
    return {**body, "email": email}


def readable(page, size: str, selector: str) -> None:
    """On screen, whole, and with text that contrasts with what is behind it (WCAG AA: 4.5)."""
    node = page.locator(selector)
    expect(node).to_be_visible()
    box = node.bounding_box()
    assert 0 <= box["x"] and box["x"] + box["width"] <= SIZES[size]["width"], f"{selector} runs off the screen"
    ratio = node.evaluate(CONTRAST)
    assert ratio >= 4.5, f"{selector}: contrast {ratio:.2f} ({node.evaluate('n => getComputedStyle(n).color')})"


# --- 1: which account, by name, with the person's email and role ----------------------------------------------------
@pytest.mark.parametrize("size", SIZES)
def test_a_person_in_two_accounts_sees_which_one_by_name_with_their_email_and_role(watched, stack, size, tmp_path):
    theirs = stack.account(address("acme-owner"), PASSWORD)
    status, named, _ = stack.call("PATCH", "/account", {"name": "Acme research"}, token=theirs["token"])
    assert status == 200 and named["name"] == "Acme research"
    mine = stack.account(address("a.rather.long.name"), PASSWORD)
    join(stack, theirs, "billing", mine)
    w = opened(watched, size)
    page = w.page
    sign_in(page, stack, mine["email"])
    picker = page.get_by_test_id("account-picker")
    expect(picker).to_be_visible()
    expect(picker.locator("option")).to_have_text(["Your account (owner)", "Acme research (billing)"])
    expect(page.get_by_test_id("who-email")).to_have_text(mine["email"])
    expect(page.get_by_test_id("who-role")).to_have_text("owner")
    for part in ("#account-picker", "#who-email", "#who-role", "#logout"):
        readable(page, size, part)
    assert page.get_by_test_id("who-email").evaluate(LINES) == 1, "the email wraps"
    fits(page, size)
    shot(page, tmp_path, f"header-own-{size}", full_page=False)

    picker.select_option(theirs["account_id"])
    expect(page.get_by_test_id("who-role")).to_have_text("billing")
    expect(picker.locator("option:checked")).to_have_text("Acme research (billing)")
    readable(page, size, "#account-picker")
    # Their own account, named from the overview by its owner: the header says the name at once.
    picker.select_option(mine["account_id"])
    expect(page.get_by_test_id("who-role")).to_have_text("owner")
    page.get_by_role("link", name="Overview").click()
    page.get_by_test_id("account-name").fill("Side project")
    page.get_by_test_id("account-name-save").click()
    expect(picker.locator("option")).to_have_text(["Side project (owner)", "Acme research (billing)"])
    page.reload()
    expect(picker.locator("option:checked")).to_have_text("Side project (owner)")
    expect(page.get_by_test_id("account-name")).to_have_value("Side project")
    # In the other account, billing may not rename it: the reason, not a button that fails.
    picker.select_option(theirs["account_id"])
    expect(page.get_by_test_id("account-name-save")).to_be_disabled()
    expect(page.locator("#account-name-form").get_by_test_id("role-note")).to_contain_text("this needs owner")
    fits(page, size)
    shot(page, tmp_path, f"header-theirs-{size}", full_page=False)
    w.check()


@pytest.mark.parametrize("size", SIZES)
def test_a_person_in_one_account_sees_its_name_their_email_and_role(watched, stack, size):
    owner = stack.account(address("owner"), PASSWORD)
    status, _, _ = stack.call("PATCH", "/account", {"name": "Weather desk"}, token=owner["token"])
    assert status == 200
    viewer = join(stack, owner, "viewer")  # invited, with no account of their own
    w = opened(watched, size)
    page = w.page
    sign_in(page, stack, viewer["email"])
    expect(page.get_by_test_id("who-account")).to_have_text("Weather desk")
    expect(page.get_by_test_id("account-picker")).to_be_hidden()
    expect(page.get_by_test_id("who-email")).to_have_text(viewer["email"])
    expect(page.get_by_test_id("who-role")).to_have_text("viewer")
    for part in ("#who-account", "#who-email", "#who-role"):
        readable(page, size, part)
    w.check()


# --- 2: Activity's "By" names each member; every action has its words and its filter ---------------------------------
@pytest.mark.parametrize("size", SIZES)
def test_activity_says_you_for_your_entries_and_the_email_for_another_members(watched, stack, size, tmp_path):
    owner = stack.account(address("owner"), PASSWORD)
    dev = join(stack, owner, "developer")  # invited by the owner; joined (and signed in) by the developer
    status, _, _ = stack.call("POST", "/auth/login", {"email": dev["email"], "password": PASSWORD})
    assert status == 200
    pages = {}
    for who, email in (("owner", owner["email"]), ("dev", dev["email"])):
        w = opened(watched, size)
        sign_in(w.page, stack, email)
        expect(w.page.get_by_test_id("logout")).to_be_visible()
        w.page.get_by_role("link", name="Activity").click()
        expect(w.page.get_by_test_id("audit-row").first).to_be_visible()
        pages[who] = w
    for who, other in (("owner", dev["email"]), ("dev", owner["email"])):
        page = pages[who].page
        rows = page.get_by_test_id("audit-row")
        by = {(row.locator("td").nth(1).inner_text(), row.locator("td").nth(2).inner_text()) for row in rows.all()}
        mine, theirs = ("you", other) if who == "owner" else (other, "you")
        assert ("Member invited", mine) in by, by  # the owner invited
        assert ("Member joined", theirs) in by, by  # the developer joined
        signed_in = {b for what, b in by if what == "Signed in"}
        assert signed_in == {"you", other}, by  # each their own sign-in
        assert not any(re.fullmatch(r"[a-z0-9]+\.[a-z_]+", what) for what, _ in by), by  # no raw names
        # Every action the log records has words in the "What" filter, and filtering by one shows only it.
        options = page.locator("#audit-action option")
        values = options.evaluate_all("os => os.map(o => [o.value, o.textContent])")
        assert {v for v, _ in values if v} == set(ACTIONS)
        assert all(label != value for value, label in values), values
        page.get_by_test_id("audit-action").select_option("member.joined")
        page.get_by_test_id("audit-apply").click()
        expect(rows).to_have_count(1)
        expect(rows.first).to_contain_text("Member joined")
        expect(rows.first).to_contain_text("you" if who == "dev" else dev["email"])
        fits(page, size)
        shot(page, tmp_path, f"activity-{who}-{size}")
    for w in pages.values():
        w.check()


# --- 3: the page starts at the top ---------------------------------------------------------------------------------
@pytest.mark.parametrize("size", SIZES)
def test_a_page_load_starts_at_the_top_with_the_navigation_and_the_warning_in_view(watched, stack, size):
    account = stack.account(address("top"), PASSWORD)
    w = opened(watched, size)
    page = w.page
    height = SIZES[size]["height"]

    def at_the_top() -> None:
        expect(page.get_by_test_id("logout")).to_be_visible()
        warning = page.get_by_test_id("balance-warning")
        expect(warning).to_contain_text("Your balance is zero")
        page.wait_for_function("document.activeElement && document.activeElement.id === 'main'")
        assert page.evaluate("window.scrollY") == 0
        for node in (page.locator("#nav a").first, warning):
            box = node.bounding_box()
            assert 0 <= box["y"] and box["y"] + box["height"] <= height, f"off-screen at {box}"

    sign_in(page, stack, account["email"])
    at_the_top()
    for view in ("overview", "usage", "members"):
        page.goto(f"{stack.url}/#{view}")
        page.reload()
        at_the_top()
    w.check()


# --- 6: the last owner, recovery codes, /docs --------------------------------------------------------------------------
@pytest.mark.parametrize("size", SIZES)
def test_the_last_owner_is_told_before_and_not_offered_leave(watched, stack, size, tmp_path):
    owner = stack.account(address("last-owner"), PASSWORD)
    dev = join(stack, owner, "developer")
    w = opened(watched, size)
    page = w.page
    sign_in(page, stack, owner["email"])
    page.get_by_role("link", name="Members").click()
    me = page.get_by_test_id("member").filter(has_text="(you)")
    expect(me.get_by_test_id("last-owner")).to_contain_text("only owner")
    expect(me.get_by_test_id("leave-account")).to_have_count(0)
    expect(page.get_by_test_id("member").filter(has_text=dev["email"]).get_by_test_id("remove-member")).to_be_visible()
    fits(page, size)
    shot(page, tmp_path, f"last-owner-{size}")
    # A second owner: now either may leave.
    row = page.get_by_test_id("member").filter(has_text=dev["email"])
    row.get_by_test_id("member-role").select_option("owner")
    expect(me.get_by_test_id("leave-account")).to_be_visible()
    expect(me.get_by_test_id("last-owner")).to_have_count(0)
    w.check()


@pytest.mark.parametrize("size", SIZES)
def test_recovery_codes_are_copied_and_downloaded(watched, stack, size, tmp_path):
    account = stack.account(address("codes"), PASSWORD)
    viewport = SIZES[size] | ({"is_mobile": True, "has_touch": True} if size == "phone" else {})
    w = watched(viewport=viewport, permissions=["clipboard-read", "clipboard-write"])
    page = w.page
    sign_in(page, stack, account["email"])
    page.get_by_role("link", name="Security").click()
    page.get_by_test_id("tfa-setup-password").fill(PASSWORD)
    page.get_by_test_id("tfa-setup").click()
    expect(page.get_by_test_id("tfa-secret")).to_have_text(re.compile(r"^\w{4} \w{4}"))
    secret = page.get_by_test_id("tfa-secret").inner_text().replace(" ", "")
    page.get_by_test_id("tfa-code").fill(pyotp.TOTP(secret).now())
    page.get_by_test_id("tfa-enable").click()
    codes = page.locator("#tfa-recovery-codes li")
    expect(codes).to_have_count(10)
    shown = codes.all_inner_texts()
    page.get_by_test_id("tfa-recovery-copy").click()
    expect(page.get_by_test_id("tfa-recovery-status")).to_have_text("Copied.")
    assert page.evaluate("navigator.clipboard.readText()").split() == shown
    with page.expect_download() as download:
        page.get_by_test_id("tfa-recovery-download").click()
    saved = download.value
    assert re.fullmatch(r"recovery-codes-.+\.txt", saved.suggested_filename)
    text = open(saved.path()).read()
    assert account["email"] in text and [line for line in text.splitlines() if line in shown] == shown
    fits(page, size)
    shot(page, tmp_path, f"recovery-codes-{size}")
    w.check()


@pytest.mark.parametrize("size", SIZES)
def test_the_docs_authorize_dialog_offers_customers_their_credentials_only(watched, stack, size):
    w = opened(watched, size)
    page = w.page
    page.goto(stack.url + "/docs")
    expect(page.locator("#operations-account-get_account")).to_be_visible()
    page.locator(".auth-wrapper .authorize").click()
    dialog = page.locator(".modal-ux")
    expect(dialog.locator(".auth-container")).to_have_count(2)
    expect(dialog).to_contain_text("bearerAuth")
    expect(dialog).to_contain_text("apiKey")
    expect(dialog).not_to_contain_text("metricsToken")
    expect(dialog).not_to_contain_text("METRICS_TOKEN")
    w.check()
