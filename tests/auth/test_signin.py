"""Two-factor sign-in (TOTP) and password reset by an emailed link: success and every way they refuse."""

import asyncio
import email
import re
import time

import pyotp
import pytest
from support import PASSWORD, make_settings

pytestmark = pytest.mark.gen_test(timeout=40)

NEW_PASSWORD = "a brand new passphrase"


def code(secret: str, steps: int = 0) -> str:
    """The code of the current time step, or of `steps` later (accepted: one step of clock drift)."""
    return pyotp.TOTP(secret).at(time.time() + 30 * steps)


async def enrolled(api, user) -> tuple[str, list[str]]:
    status, setup, _ = await api.call("POST", "/auth/2fa/setup", {"password": PASSWORD}, token=user["token"])
    assert status == 200, setup
    assert setup["otpauth_uri"].startswith("otpauth://totp/") and setup["secret"] in setup["otpauth_uri"]
    assert setup["qr_svg"].startswith("data:image/svg+xml;base64,")
    status, done, _ = await api.call("POST", "/auth/2fa/enable", {"code": code(setup["secret"])}, token=user["token"])
    assert status == 200, done
    return setup["secret"], done["recovery_codes"]


async def login(api, user, password=PASSWORD, **extra):
    return await api.call("POST", "/auth/login", {"email": user["email"], "password": password, **extra})


async def test_enrol_then_login_asks_the_second_factor(api, ctx):
    user = await api.register()
    secret, recovery = await enrolled(api, user)
    assert len(recovery) == 10 and len(set(recovery)) == 10
    stored = await ctx.accounts.accounts.find_one({"_id": user["account_id"]})
    assert secret not in str(stored) and not any(c in str(stored) for c in recovery)  # sealed and hashed at rest
    status, state, _ = await api.call("GET", "/auth/2fa", token=user["token"])
    assert state["enabled"] is True and state["recovery_codes_left"] == 10
    assert (await api.call("GET", "/auth/me", token=user["token"]))[1]["two_factor"] is True  # the session goes on

    status, first, _ = await login(api, user)
    assert status == 200 and first["two_factor_required"] is True and "token" not in first
    assert (await api.call("GET", "/auth/me", token=first["challenge"]))[0] == 401  # a challenge is no session
    status, body, _ = await api.call("POST", "/auth/login/2fa", {"challenge": first["challenge"], "code": "000000"})
    assert status == 401 and body["detail"] == "Incorrect or already used code"
    next_code = code(secret, 1)
    status, body, _ = await api.call("POST", "/auth/login/2fa", {"challenge": first["challenge"], "code": next_code})
    assert status == 200 and body["token"]
    assert (await api.call("GET", "/auth/me", token=body["token"]))[0] == 200
    # The same code again (replay), or an earlier one: refused within their window.
    for used in (next_code, code(secret)):
        status, _, _ = await login(api, user, code=used)
        assert status == 401, used
    # A recovery code works once, in any case and with or without its dash.
    status, body, _ = await login(api, user, code=recovery[0].upper().replace("-", " "))
    assert status == 200 and body["token"]
    assert (await login(api, user, code=recovery[0]))[0] == 401
    assert (await api.call("GET", "/auth/2fa", token=user["token"]))[1]["recovery_codes_left"] == 9
    status, audit, _ = await api.call(
        "GET", "/audit?action=2fa.enabled,2fa.failed,2fa.recovery_used,login", token=user["token"]
    )
    assert [e["action"] for e in audit["entries"]][:3] == ["2fa.failed", "login", "2fa.recovery_used"]


async def test_enrolment_needs_the_password_and_a_right_first_code(api):
    user = await api.register()
    status, body, _ = await api.call("POST", "/auth/2fa/setup", {"password": "not my password"}, token=user["token"])
    assert status == 403
    status, body, _ = await api.call("POST", "/auth/2fa/enable", {"code": "123456"}, token=user["token"])
    assert status == 409 and "setup" in body["detail"]
    status, setup, _ = await api.call("POST", "/auth/2fa/setup", {"password": PASSWORD}, token=user["token"])
    wrong = f"{(int(code(setup['secret'])) + 1) % 1_000_000:06d}"
    status, body, _ = await api.call("POST", "/auth/2fa/enable", {"code": wrong}, token=user["token"])
    assert status == 422 and body["detail"][0]["loc"] == ["body", "code"]
    assert (await login(api, user))[1]["token"]  # not enrolled: the login is one step still
    assert (await api.call("POST", "/auth/2fa/setup", {"password": PASSWORD}))[0] == 401


async def test_disable_needs_a_code_or_the_password(api):
    user = await api.register()
    secret, _ = await enrolled(api, user)
    status, body, _ = await api.call("POST", "/auth/2fa/disable", {}, token=user["token"])
    assert status == 422 and body["detail"][0]["loc"] == ["body"]
    status, _, _ = await api.call("POST", "/auth/2fa/disable", {"password": "wrong password"}, token=user["token"])
    assert status == 403
    status, _, _ = await api.call("POST", "/auth/2fa/disable", {"code": code(secret, 1)}, token=user["token"])
    assert status == 200
    assert (await login(api, user))[1]["token"]
    status, audit, _ = await api.call("GET", "/audit?action=2fa.disabled", token=user["token"])
    assert audit["entries"][0]["details"] == {"confirmed_with": "totp"}


async def test_wrong_codes_are_throttled_and_concurrent_use_of_one_code_wins_once(api):
    user = await api.register()
    secret, _ = await enrolled(api, user)
    challenges = [(await login(api, user))[1]["challenge"] for _ in range(2)]
    good = code(secret, 1)
    tries = [api.call("POST", "/auth/login/2fa", {"challenge": c, "code": good}) for c in challenges * 2]
    statuses = sorted(r[0] for r in await asyncio.gather(*tries))
    assert statuses == [200, 401, 401, 401]  # one time step, one sign-in
    # Five wrong codes in 5 minutes (the racing losers above may be some of them, or came before the winner
    # cleared the count), then 429 for every attempt. (On a fresh challenge: a spent one is 401 before any code.)
    fresh = (await login(api, user))[1]["challenge"]
    answers = [await api.call("POST", "/auth/login/2fa", {"challenge": fresh, "code": "111111"}) for _ in range(6)]
    statuses = [a[0] for a in answers]
    first = statuses.index(429)
    assert 2 <= first <= 5 and set(statuses[:first]) == {401} and set(statuses[first:]) == {429}, statuses
    assert int(answers[first][2]["Retry-After"]) >= 1


@pytest.mark.settings(admin_require_2fa=True)
async def test_admins_need_two_factor_when_required(api, ctx):
    admin = await api.register()
    assert await ctx.accounts.set_admin(admin["email"], True)
    status, body, _ = await api.call("GET", "/admin/audit", token=admin["token"])
    assert status == 403 and "/auth/2fa/setup" in body["detail"]
    assert (await api.call("GET", "/auth/2fa", token=admin["token"]))[1]["required"] is True
    await enrolled(api, admin)
    assert (await api.call("GET", "/admin/audit", token=admin["token"]))[0] == 200


# --- password reset ---------------------------------------------------------------------------------------------------


@pytest.fixture
def settings(request, inbox):
    marker = request.node.get_closest_marker("settings")
    return make_settings(smtp_url=f"smtp://127.0.0.1:{inbox.port}", **(marker.kwargs if marker else {}))


def link_in(message: dict) -> str:
    body = email.message_from_string(message["data"]).get_payload(decode=True).decode()
    return re.search(r"#reset=([A-Za-z0-9_.-]+)", body).group(1)


async def test_forgot_answers_the_same_and_the_link_resets_once_ending_every_session(api, inbox):
    user = await api.register()
    other_session = (await login(api, user))[1]["token"]
    started = time.perf_counter()
    known = await api.call("POST", "/auth/password/forgot", {"email": user["email"].upper()})
    known_s = time.perf_counter() - started
    started = time.perf_counter()
    unknown = await api.call("POST", "/auth/password/forgot", {"email": "nobody-here@example.com"})
    unknown_s = time.perf_counter() - started
    assert known[:2] == unknown[:2] and known[0] == 202
    assert abs(known_s - unknown_s) < 0.05  # answered before the lookup: no timing to tell them apart
    (message,) = await inbox.until(1)
    await asyncio.sleep(0.2)
    assert len(inbox.messages) == 1 and message["to"] == [user["email"]]  # none for the unknown address
    token = link_in(message)

    status, body, _ = await api.call("POST", "/auth/password/reset", {"token": token, "password": "short"})
    assert status == 422 and body["detail"][0]["loc"] == ["body", "password"]
    status, body, _ = await api.call("POST", "/auth/password/reset", {"token": token, "password": NEW_PASSWORD})
    assert status == 200, body
    for session in (user["token"], other_session):
        assert (await api.call("GET", "/auth/me", token=session))[0] == 401
    assert (await login(api, user))[0] == 401
    assert (await login(api, user, NEW_PASSWORD))[0] == 200
    status, body, _ = await api.call("POST", "/auth/password/reset", {"token": token, "password": "another new one"})
    assert status == 422 and body["detail"][0]["loc"] == ["body", "token"]  # single use
    token = (await login(api, user, NEW_PASSWORD))[1]["token"]
    status, audit, _ = await api.call("GET", "/audit?action=password.reset,password.reset_requested", token=token)
    assert [e["action"] for e in audit["entries"]] == ["password.reset", "password.reset_requested"]


async def test_reset_links_refused_when_forged_expired_or_raced(api, inbox, ctx):
    from security import tokens

    user = await api.register()
    forged = tokens.issue_purpose("not the secret, but long enough for HS256", tokens.RESET, user["account_id"], 600, 0)
    session_like = user["token"]
    expired = tokens.issue_purpose(ctx.settings.jwt_secret, tokens.RESET, user["account_id"], -60, 0)
    for bad in (forged, session_like, expired, "x"):
        status, body, _ = await api.call("POST", "/auth/password/reset", {"token": bad, "password": NEW_PASSWORD})
        assert status == 422 and body["detail"][0]["loc"] == ["body", "token"], bad
    await api.call("POST", "/auth/password/forgot", {"email": user["email"]})
    token = link_in((await inbox.until(1))[0])
    tries = [
        api.call("POST", "/auth/password/reset", {"token": token, "password": f"{NEW_PASSWORD} {n}"}) for n in range(3)
    ]
    assert sorted(r[0] for r in await asyncio.gather(*tries)) == [200, 422, 422]
    for _ in range(4):  # at most three emails an hour per address; the answer stays the same
        assert (await api.call("POST", "/auth/password/forgot", {"email": user["email"]}))[0] == 202
    await asyncio.sleep(0.5)
    assert len(inbox.messages) == 3


async def test_password_change_ends_other_sessions_and_is_audited(api):
    user = await api.register()
    other = (await login(api, user))[1]["token"]
    status, body, _ = await api.call(
        "POST", "/auth/password", {"current_password": PASSWORD, "new_password": NEW_PASSWORD}, token=user["token"]
    )
    assert status == 200 and body["token"]
    assert (await api.call("GET", "/auth/me", token=other))[0] == 401
    status, audit, _ = await api.call("GET", "/audit?action=password.changed", token=body["token"])
    assert len(audit["entries"]) == 1


async def test_no_second_factor_or_reset_secret_reaches_the_logs(api, ctx, inbox, caplog):
    import logging

    caplog.set_level(logging.DEBUG)
    user = await api.register()
    secret, recovery = await enrolled(api, user)
    challenge = (await login(api, user))[1]["challenge"]
    used = code(secret, 1)
    assert (await api.call("POST", "/auth/login/2fa", {"challenge": challenge, "code": used}))[0] == 200
    assert (await login(api, user, code=recovery[0]))[0] == 200
    await api.call("POST", "/auth/password/forgot", {"email": user["email"]})
    token = link_in((await inbox.until(1))[0])
    assert (await api.call("POST", "/auth/password/reset", {"token": token, "password": NEW_PASSWORD}))[0] == 200
    # The test's own SMTP server (aiosmtpd, logger "mail.log") is not the gateway: its records are left out.
    text = "\n".join(
        f"{r.name} {r.getMessage()} {r.exc_text or ''}" for r in caplog.records if not r.name.startswith("mail")
    )
    assert "gateway.access" in text  # the logs were captured
    for label, value in [
        ("TOTP secret", secret),
        ("TOTP code", used),
        ("recovery code", recovery[0]),
        ("challenge", challenge),
        ("reset token", token),
        ("new password", NEW_PASSWORD),
    ]:
        assert value not in text, f"the {label} appears in the logs"


async def test_an_email_with_a_line_break_after_it_is_refused_everywhere_it_is_typed(api):
    """A trailing newline passed the email format (`$` matches before it): saved, it breaks every mail header
    written with it. Registration and invitations refuse it as they refuse any other malformed address."""
    status, body, _ = await api.call(
        "POST", "/auth/register", {"email": "new-person@example.com\n", "password": PASSWORD}
    )
    assert status == 422 and body["detail"][0]["loc"] == ["body", "email"], body
    owner = await api.register()
    status, body, _ = await api.call(
        "POST", "/members/invitations", {"email": "guest@example.com\n", "role": "viewer"}, token=owner["token"]
    )
    assert status == 422 and body["detail"][0]["loc"] == ["body", "email"], body
