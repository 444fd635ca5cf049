"""Account security in a real browser, at a desktop's 1280×800 and a phone's 390×844: enrol two-factor sign-in
and sign in with a code, reset a forgotten password through the link a real SMTP server received, and read
the audit log (filter, export). Each flow fails on a page wider than the screen, and saves screenshots
under the test's tmp_path. The browser helpers are tests/portal/test_browser.py's; this module runs its own
gateway, with SMTP_URL at an SMTP server in this process."""

import email
import re
import time
import uuid

import pyotp
import pytest
import test_browser
from support import Inbox
from test_browser import PASSWORD, expect, register, shot

from gateway_testing.stack import Stack

pytestmark = test_browser.pytestmark  # skipped, with the reason, without Chromium
browser, watched = test_browser.browser, test_browser.watched  # the same fixtures, on this module's stack

SIZES = {"desktop": {"width": 1280, "height": 800}, "phone": {"width": 390, "height": 844}}
NEW_PASSWORD = "a fresh portal passphrase"


@pytest.fixture(scope="module")
def inbox():
    started = Inbox()
    yield started
    started.stop()


@pytest.fixture(scope="module")
def stack(inbox):
    env = {
        "SMTP_URL": f"smtp://127.0.0.1:{inbox.port}",
        "SIGNUP_CREDITS": str(test_browser.SIGNUP_CREDITS),  # what test_browser.register expects to see
        "SIGNUP_CREDITED_PER_NETWORK": "1000000",
        "CACHE_MAX_BYTES": "0",  # as test_browser's stack: every call a live read
    }
    with Stack(in_memory=True, gateway_env=env) as running:
        yield running


def opened(watched, size: str):
    viewport = SIZES[size]
    phone = {"is_mobile": True, "has_touch": True} if size == "phone" else {}
    return watched(viewport=viewport, **phone)


def fits(page, size: str) -> None:
    """Nothing scrolls sideways, and no table cell is cut off at the screen's edge."""
    width = SIZES[size]["width"]
    scrolled = page.evaluate("document.documentElement.scrollWidth")
    assert scrolled <= width, f"the page scrolls sideways at {width} px ({scrolled} px)"
    clipped = page.evaluate(
        """() => [...document.querySelectorAll('main td, main th')]
                 .filter(c => c.offsetParent !== null && c.scrollWidth > c.clientWidth + 1)
                 .map(c => c.textContent.slice(0, 40))"""
    )
    assert clipped == [], f"cells cut off: {clipped}"


def sign_in(page, stack, address: str, password: str = PASSWORD) -> None:
    page.goto(stack.url + "/")
    page.get_by_test_id("email").fill(address)
    page.get_by_test_id("password").fill(password)
    page.get_by_test_id("login").click()


def log_out(page) -> None:
    page.get_by_test_id("logout").click()
    expect(page.get_by_test_id("login")).to_be_visible()
    expect(page.get_by_test_id("auth-notice")).to_have_text(re.compile("^You are signed out"))  # said, not guessed


@pytest.mark.parametrize("size", SIZES)
def test_enrol_two_factor_then_sign_in_with_a_code(watched, stack, size, tmp_path):
    w = opened(watched, size)
    page = w.page
    address = register(page, stack)
    page.get_by_role("link", name="Security").click()
    expect(page.get_by_test_id("tfa-status")).to_contain_text("Off")
    page.get_by_test_id("tfa-setup-password").fill("not the password")
    page.get_by_test_id("tfa-setup").click()
    expect(page.locator("#tfa-setup-form [data-testid=error]")).to_have_text(re.compile("password is incorrect"))
    page.get_by_test_id("tfa-setup-password").fill(PASSWORD)
    page.get_by_test_id("tfa-setup").click()
    expect(page.locator("#tfa-qr")).to_be_visible()
    assert page.locator("#tfa-qr").evaluate("img => img.naturalWidth") > 100  # the QR code was drawn
    secret = page.get_by_test_id("tfa-secret").inner_text().replace(" ", "")
    totp = pyotp.TOTP(secret)
    page.get_by_test_id("tfa-code").fill(f"{(int(totp.now()) + 1) % 1_000_000:06d}")
    page.get_by_test_id("tfa-enable").click()
    expect(page.locator("#tfa-enable-form [data-testid=error]")).to_contain_text("Incorrect code")
    page.get_by_test_id("tfa-code").fill(totp.now())
    page.get_by_test_id("tfa-enable").click()
    expect(page.locator("#tfa-recovery-codes li")).to_have_count(10)
    expect(page.get_by_test_id("tfa-status")).to_have_text(
        re.compile(r"^On since \d{4}-\d\d-\d\d \d\d:\d\d UTC\. 10 recovery codes left\.$")  # "UTC" once
    )
    fits(page, size)
    shot(page, tmp_path, f"{size}-2fa-recovery-codes")

    log_out(page)
    sign_in(page, stack, address)
    expect(page.get_by_test_id("second-factor-code")).to_be_visible()
    expect(page.get_by_test_id("logout")).to_be_hidden()  # the password alone did not sign in
    page.get_by_test_id("second-factor-code").fill("000000")
    page.get_by_test_id("second-factor-submit").click()
    expect(page.locator("#second-factor-form [data-testid=error]")).to_have_text(
        re.compile("Incorrect or already used")
    )
    fits(page, size)
    shot(page, tmp_path, f"{size}-2fa-sign-in")
    page.get_by_test_id("second-factor-code").fill(totp.at(time.time() + 30))  # the next step: never replayed
    page.get_by_test_id("second-factor-submit").click()
    expect(page.get_by_test_id("logout")).to_be_visible()
    page.get_by_role("link", name="Security").click()
    expect(page.get_by_test_id("tfa-status")).to_contain_text("On since")
    w.check(allowed_errors="status of (401|403|422)")


@pytest.mark.parametrize("size", SIZES)
def test_reset_a_forgotten_password_with_the_emailed_link(watched, stack, inbox, size, tmp_path):
    address = f"reset-{uuid.uuid4().hex[:10]}@example.com"
    stack.account(address, PASSWORD)
    w = opened(watched, size)
    page = w.page
    page.goto(stack.url + "/")
    page.get_by_test_id("email").fill(address)
    page.get_by_test_id("forgot-open").click()
    expect(page.get_by_test_id("forgot-email")).to_have_value(address)
    page.get_by_test_id("forgot-submit").click()
    expect(page.get_by_test_id("forgot-sent")).to_contain_text("If an account uses this address")
    fits(page, size)
    shot(page, tmp_path, f"{size}-forgot")
    deadline = time.monotonic() + 10
    while not any(m["to"] == [address] for m in inbox.messages) and time.monotonic() < deadline:
        time.sleep(0.05)
    message = next(m for m in inbox.messages if m["to"] == [address])
    text = email.message_from_string(message["data"]).get_payload(decode=True).decode()
    link = re.search(r"http://\S+/#reset=\S+", text).group(0)
    assert link.startswith(stack.url + "/#reset=")

    page.goto(link)
    expect(page.get_by_test_id("reset-password")).to_be_visible()
    assert "reset=" not in page.url  # the token leaves the address bar (and the history) at once
    page.get_by_test_id("reset-password").fill("aaaaaaaaaa")
    page.get_by_test_id("reset-submit").click()
    expect(page.locator("#reset-form [data-testid=error]")).to_contain_text("too weak")
    page.get_by_test_id("reset-password").fill(NEW_PASSWORD)
    page.get_by_test_id("reset-submit").click()
    expect(page.get_by_test_id("auth-notice")).to_contain_text("log in with the new password")
    fits(page, size)
    shot(page, tmp_path, f"{size}-reset-done")
    sign_in(page, stack, address, NEW_PASSWORD)
    expect(page.get_by_test_id("logout")).to_be_visible()
    # The link worked once: opened again, it is refused next to the form.
    page.goto(link)
    page.get_by_test_id("reset-password").fill("yet another passphrase")
    page.get_by_test_id("reset-submit").click()
    expect(page.locator("#reset-form [data-testid=error]")).to_contain_text("already used")
    w.check(allowed_errors="status of 422")


@pytest.mark.parametrize("size", SIZES)
def test_the_activity_view_shows_filters_and_exports_who_did_what(watched, stack, size, tmp_path):
    w = opened(watched, size)
    page = w.page
    address = register(page, stack)
    page.get_by_role("link", name="API keys").click()
    page.get_by_test_id("key-name").fill("a-rather-long-key-name-for-reporting-pipelines")
    page.get_by_test_id("create-key").click()
    expect(page.get_by_test_id("key-secret")).to_be_visible()
    log_out(page)
    sign_in(page, stack, address, "wrong password!")
    expect(page.locator("#auth-form [data-testid=error]")).to_be_visible()
    sign_in(page, stack, address)
    expect(page.get_by_test_id("logout")).to_be_visible()
    page.get_by_role("link", name="Activity").click()
    rows = page.get_by_test_id("audit-row")
    expect(rows).to_have_count(5)
    expect(rows.nth(0)).to_contain_text("Signed in")
    expect(rows.nth(1)).to_contain_text("Failed sign-in")
    expect(rows.nth(3)).to_contain_text("a-rather-long-key-name-for-reporting-pipelines")
    expect(rows.nth(3)).to_contain_text("you")
    expect(rows.nth(4)).to_contain_text("Account created")  # registering is the first thing the log shows
    fits(page, size)
    shot(page, tmp_path, f"{size}-activity")
    page.get_by_test_id("audit-action").select_option("key.created")
    page.get_by_test_id("audit-apply").click()
    expect(rows).to_have_count(1)
    href = page.get_by_test_id("audit-csv").get_attribute("href")
    assert href == "/audit/export?action=key.created&format=csv"
    exported = page.request.get(stack.url + href)
    assert exported.ok and exported.text().splitlines()[1].split(",")[1] == "key.created"
    w.check(allowed_errors="status of 401")


def test_a_slow_two_factor_status_does_not_undo_turning_it_on(watched, stack):
    w = watched()
    page = w.page
    register(page, stack)
    page.get_by_role("link", name="Security").click()
    expect(page.get_by_test_id("tfa-status")).to_contain_text("Off")
    page.get_by_role("link", name="Overview").click()
    held = test_browser.hold_first(page, "**/auth/2fa")  # "off"
    page.get_by_role("link", name="Security").click()  # the form shown by the earlier visit stays usable
    first = test_browser.wait_held(page, held, "/auth/2fa")
    page.get_by_test_id("tfa-setup-password").fill(PASSWORD)
    page.get_by_test_id("tfa-setup").click()
    expect(page.locator("#tfa-qr")).to_be_visible()
    secret = page.get_by_test_id("tfa-secret").inner_text().replace(" ", "")
    page.get_by_test_id("tfa-code").fill(pyotp.TOTP(secret).now())
    page.get_by_test_id("tfa-enable").click()
    status = page.get_by_test_id("tfa-status")
    expect(status).to_contain_text("On since")
    test_browser.release_late(page, first)
    expect(status).to_contain_text("On since")
    expect(page.locator("#tfa-setup-form")).to_be_hidden()
    w.check()
