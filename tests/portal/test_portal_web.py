"""The portal's HTTP contract: the page and its policy, cookie sessions that scripts cannot read, XSRF on
every cookie-authenticated write, bearer tokens unchanged, and the order QR code. The browser tests
(tests/portal/test_browser.py) drive the same page in Chromium."""

import re
import uuid
from http.cookies import SimpleCookie

import pytest
from support import PASSWORD

pytestmark = pytest.mark.gen_test(timeout=60)


class Browser:
    """Cookies and the page's XSRF token, as a browser on the portal keeps them."""

    def __init__(self, api):
        self.api, self.cookies, self.xsrf = api, {}, ""

    def keep(self, headers) -> list:
        morsels = []
        for line in headers.get_list("Set-Cookie"):
            jar = SimpleCookie()
            jar.load(line)
            for name, morsel in jar.items():
                morsels.append(morsel)
                if not morsel.value:  # a cleared cookie
                    self.cookies.pop(name, None)
                else:
                    self.cookies[name] = morsel.value
        return morsels

    async def open(self, path: str = "/"):
        status, page, headers = await self.call("GET", path)
        self.xsrf = re.search(rb'name="xsrf-token" content="([^"]+)"', page).group(1).decode()
        return status, page.decode(), headers

    async def call(self, method, path, body=None, xsrf=True, headers=None):
        sent = dict(headers or {})
        if self.cookies:
            sent["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        if xsrf and self.xsrf and method != "GET":
            sent["X-XSRFToken"] = self.xsrf
        status, answer, got = await self.api.call(method, path, body, headers=sent)
        self.keep(got)
        return status, answer, got


async def signed_in(api) -> tuple[Browser, str]:
    browser = Browser(api)
    await browser.open()
    email = f"web-{uuid.uuid4().hex[:10]}@example.com"
    status, body, _ = await browser.call("POST", "/portal/register", {"email": email, "password": PASSWORD})
    assert status == 200, body
    return browser, email


async def test_page_is_served_with_a_strict_policy(api):
    browser = Browser(api)
    status, page, headers = await browser.open()
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    policy = headers["Content-Security-Policy"]
    for directive in ("default-src 'none'", "script-src 'self';", "connect-src 'self'", "frame-ancestors 'none'"):
        assert directive in policy
    assert "unsafe" not in policy
    assert "<script>" not in page and not re.search(r"(src|href)=\"https?:", page)
    # Versioned static URLs, served with long caching.
    script = re.search(r'<script src="(/static/portal\.js\?v=[0-9a-f]+)"', page).group(1)
    response = await api.http.fetch(api.base + script)
    assert response.code == 200 and "max-age=31536000" in response.headers["Cache-Control"]
    # The data-testid contract; key-row, revoke-key and usage-row are drawn by the script (test_browser.py).
    for testid in (
        "email",
        "password",
        "register",
        "login",
        "logout",
        "balance",
        "plan",
        "create-key",
        "key-name",
        "key-secret",
        "usage-chart",
        "checkout-currency",
        "checkout-amount",
        "checkout-submit",
        "order-status",
        "error",
    ):
        assert f'data-testid="{testid}"' in page, testid
    # The script and every ES module it imports (each view's in static/js/). Those are named without a content
    # hash, so they are revalidated: a page never runs a new portal.js with an old module.
    scripts, seen, script = [re.search(r'src="(/static/portal\.js[^"]*)"', page).group(1)], set(), b""
    while scripts:
        url = scripts.pop()
        seen.add(url)
        response = await api.http.fetch(api.base + url)
        assert response.headers["Content-Type"].startswith(("text/javascript", "application/javascript")), url
        if "?v=" not in url:
            assert response.headers["Cache-Control"] == "no-cache", url
        script += response.body
        folder = url.split("?")[0].rsplit("/", 1)[0]
        imported = re.findall(rb'^import [^;]* from "\./([\w/.]+\.js)";', response.body, re.M)
        scripts += [f"{folder}/{name.decode()}" for name in imported if f"{folder}/{name.decode()}" not in seen]
    assert len(seen) > 5, seen  # the views are modules
    for testid in (b'"key-row"', b'"revoke-key"', b'"usage-row"'):
        assert testid in script
    xsrf = next(m for m in browser.keep(headers) if m.key == "gw_xsrf")
    assert xsrf["httponly"] and xsrf["samesite"] == "Strict"


async def test_cookie_session_is_httponly_strict_and_not_in_the_body(api):
    browser = Browser(api)
    await browser.open()
    email = f"web-{uuid.uuid4().hex[:10]}@example.com"
    status, body, headers = await browser.call("POST", "/portal/register", {"email": email, "password": PASSWORD})
    assert status == 200 and "token" not in body and body["expires_in"] > 0
    session = next(m for m in SimpleCookie(headers.get_list("Set-Cookie")[-1]).values())
    assert session.key == "gw_session" and session["httponly"] and session["samesite"] == "Strict"
    assert not session["secure"]  # development over plain HTTP; production below
    status, me, _ = await browser.call("GET", "/auth/me")
    assert status == 200 and me["email"] == email
    # Logging in again from another browser works the same way.
    other = Browser(api)
    await other.open()
    status, body, _ = await other.call("POST", "/portal/login", {"email": email, "password": PASSWORD})
    assert status == 200 and "gw_session" in other.cookies
    status, body, _ = await other.call("POST", "/portal/login", {"email": email, "password": "wrong password"})
    assert status == 401 and body == {"detail": "Incorrect email or password"}


@pytest.mark.settings(env="production", admin_emails="")
async def test_production_cookies_are_secure_and_host_only(api):
    browser = Browser(api)
    _, _, headers = await browser.open()
    assert any(m.key == "__Host-gw_xsrf" and m["secure"] for m in browser.keep(headers))
    status, _, headers = await browser.call(
        "POST", "/portal/register", {"email": f"p-{uuid.uuid4().hex[:8]}@example.com", "password": PASSWORD}
    )
    assert status == 200
    session = next(m for m in SimpleCookie(headers.get_list("Set-Cookie")[-1]).values())
    assert session.key == "__Host-gw_session" and session["secure"] and session["path"] == "/"
    assert (await browser.call("GET", "/account"))[0] == 200


async def test_cookie_authenticated_writes_need_the_xsrf_token(api):
    browser, _ = await signed_in(api)
    status, body, _ = await browser.call("POST", "/keys", {"name": "forged"}, xsrf=False)
    assert status == 403 and "XSRF" in body["detail"]
    status, body, _ = await browser.call(
        "POST", "/keys", {"name": "forged"}, xsrf=False, headers={"X-XSRFToken": "2|00|00|00"}
    )
    assert status == 403
    status, keys, _ = await browser.call("GET", "/keys")  # reads need no token; nothing was created
    assert status == 200 and keys == []
    status, key, _ = await browser.call("POST", "/keys", {"name": "mine"})
    assert status == 200 and key["name"] == "mine"
    # The session endpoints themselves need it, so another site cannot log a browser in or out.
    assert (await browser.call("POST", "/portal/logout", xsrf=False))[0] == 403
    fresh = Browser(api)
    status, _, _ = await fresh.call("POST", "/portal/login", {"email": "a@example.com", "password": "x" * 8})
    assert status == 403
    # A method the route does not have is 405 whatever the cookies, as everywhere else.
    status, _, headers = await browser.call("PUT", "/portal/login", {}, xsrf=False)
    assert status == 405 and headers["Allow"] == "POST"


async def test_bearer_tokens_work_as_before_without_xsrf(api):
    user = await api.register()
    status, key, _ = await api.call("POST", "/keys", {"name": "api"}, token=user["token"])
    assert status == 200
    # A bearer header wins over a cookie sent beside it, and then no XSRF token is asked for.
    browser, _ = await signed_in(api)
    status, body, _ = await browser.call(
        "POST", "/keys", {"name": "b"}, xsrf=False, headers={"Authorization": f"Bearer {user['token']}"}
    )
    assert status == 200
    status, keys, _ = await api.call("GET", "/keys", token=user["token"])
    assert sorted(k["name"] for k in keys) == ["api", "b"]
    # A malformed header is not rescued by the cookie.
    assert (await browser.call("GET", "/account", headers={"Authorization": "Basic abc"}))[0] == 401


async def test_logout_clears_the_cookie_and_ends_the_session(api):
    browser, _ = await signed_in(api)
    token = browser.cookies["gw_session"]
    status, body, headers = await browser.call("POST", "/portal/logout")
    assert status == 200 and body == {"ok": True}
    assert "gw_session" not in browser.cookies
    assert (await api.call("GET", "/account", token=token))[0] == 401  # a copied cookie is worthless now
    assert (await browser.call("GET", "/account"))[0] == 401
    status, _, _ = await browser.call("POST", "/portal/logout")  # idempotent
    assert status == 200


async def test_order_has_a_payment_uri_and_a_qr_code_for_its_owner_only(api):
    browser, _ = await signed_in(api)
    status, order, _ = await browser.call("POST", "/billing/crypto/checkout", {"currency": "BTC", "amount_usd": 12})
    assert status == 200
    assert order["payment_uri"] == f"bitcoin:{order['pay_address']}?amount={order['pay_amount']}"
    qr = await api.http.fetch(
        api.base + f"/billing/crypto/orders/{order['order_id']}/qr",
        headers={"Cookie": "; ".join(f"{k}={v}" for k, v in browser.cookies.items())},
    )
    assert qr.code == 200 and qr.headers["Content-Type"] == "image/svg+xml"
    assert qr.body.startswith(b"<?xml") and b"<svg" in qr.body and b"<path" in qr.body
    stranger = await api.register()
    status, body, _ = await api.call("GET", f"/billing/crypto/orders/{order['order_id']}/qr", token=stranger["token"])
    assert status == 404 and body == {"detail": "Order not found"}
    assert (await api.call("GET", f"/billing/crypto/orders/{order['order_id']}/qr"))[0] == 401


async def test_static_misses_are_json_404(api):
    status, body, headers = await api.call("GET", "/static/nope.js")
    assert status == 404 and body == {"detail": "Not found"}
    assert headers["X-Content-Type-Options"] == "nosniff"
