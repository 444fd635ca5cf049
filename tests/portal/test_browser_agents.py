"""The "Use with AI agents" view in a real browser, at a desktop's 1280×800 and a phone's 390×844 (issue 51): the
account's keys in a select, each client's configuration with this gateway's /mcp and the key's prefix until the
person shows or copies the key (the secret is asked of GET /keys/{key_id}/reveal only then), the Python client's
script run as shown, and a tool call of the official `mcp` client in the request log as "MCP · <tool>", with the
log's REST / MCP filter. The browser helpers are tests/portal/test_browser.py's; this module runs its own gateway."""

import asyncio
import json
import subprocess
import sys
import threading

import pytest
import test_browser
from test_browser import create_key, data_call, expect, register, shot
from test_browser_security import SIZES, fits

from gateway_testing.stack import Stack

pytestmark = test_browser.pytestmark  # skipped, with the reason, without Chromium
# The same fixtures, on this module's stack.
browser, watched, user_name = test_browser.browser, test_browser.watched, test_browser.user_name
CONFIGS = ("claude-code", "cursor", "claude-desktop", "python")


@pytest.fixture(scope="module")
def stack():
    env = {
        "SIGNUP_CREDITS": str(test_browser.SIGNUP_CREDITS),  # what test_browser.register expects to see
        "SIGNUP_CREDITED_PER_NETWORK": "1000000",
        "CACHE_MAX_BYTES": "0",  # every call a live read, charged and recorded as such
    }
    with Stack(in_memory=True, gateway_env=env) as running:
        yield running


def mcp_call(url: str, key: str, tool: str, arguments: dict):
    """One tool call with the official client, as an agent builder makes it (in a thread of its own: the page's
    Playwright owns this one's event loop)."""
    from mcp import Client
    from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

    async def call():
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {key}"})
        async with http, Client(streamable_http_client(url, http_client=http)) as client:
            return await client.call_tool(tool, arguments)

    answer = {}
    thread = threading.Thread(target=lambda: answer.update(result=asyncio.run(call())))
    thread.start()
    thread.join(60)
    return answer["result"]


def configs(page) -> dict:
    return {name: page.get_by_test_id(f"config-{name}").inner_text() for name in CONFIGS}


@pytest.mark.parametrize("size", SIZES)
def test_agents_view_configures_a_key_and_the_request_log_shows_its_tool_calls(
    watched, stack, user_name, size, tmp_path
):
    phone = {"is_mobile": True, "has_touch": True} if size == "phone" else {}
    w = watched(viewport=SIZES[size], permissions=["clipboard-read", "clipboard-write"], **phone)
    page = w.page
    register(page, stack)
    spare_secret = create_key(page, "spare")
    page.get_by_test_id("key-name").fill("agent")
    page.get_by_test_id("create-key").click()
    expect(page.get_by_test_id("key-secret")).not_to_have_text(spare_secret)  # the new key's, not the one before
    key = page.get_by_test_id("key-secret").inner_text()
    prefix, spare = (
        page.get_by_test_id("key-row").filter(has_text=name).locator("code").inner_text().rstrip("…")
        for name in ("agent", "spare")
    )
    url = stack.url + "/mcp"

    page.get_by_role("link", name="AI agents").click()
    expect(page.get_by_test_id("agents-url")).to_have_text(url)
    chooser = page.get_by_test_id("agents-key")
    expect(chooser.locator("option")).to_have_count(2)
    assert sorted(chooser.locator("option").all_inner_texts()) == [f"agent ({prefix}…)", f"spare ({spare}…)"]
    chooser.select_option(label=f"agent ({prefix}…)")
    expect(page.get_by_test_id("config-claude-code")).to_contain_text(f"Bearer {prefix}…")
    # Hidden by default: the configurations name the key by its prefix, and nothing asked for its secret yet.
    shown = configs(page)
    assert all(url in text and key not in text for text in shown.values()), shown
    assert not [u for u in w.requests if u.endswith("/reveal")]
    expect(page.locator("[data-copy]")).to_have_count(len(CONFIGS))

    # Copying copies the working configuration, with the whole key, and still does not show it.
    page.get_by_test_id("copy-cursor").click()
    expect(page.get_by_test_id("copy-cursor").locator("xpath=..").get_by_role("status")).to_have_text("Copied.")
    copied = json.loads(page.evaluate("navigator.clipboard.readText()"))
    assert copied == {"mcpServers": {"social-gateway": {"url": url, "headers": {"Authorization": f"Bearer {key}"}}}}
    assert key not in page.locator("#view-agents").inner_text()

    page.get_by_test_id("agents-reveal").click()
    expect(page.get_by_test_id("agents-reveal")).to_have_text("Hide key")
    shown = configs(page)
    assert shown["claude-code"] == (
        f'claude mcp add --transport http social-gateway {url} --header "Authorization: Bearer {key}"'
    )
    assert json.loads(shown["cursor"]) == copied
    desktop = json.loads(shown["claude-desktop"])["mcpServers"]["social-gateway"]
    assert url in desktop["args"] and desktop["env"] == {"AUTH_HEADER": f"Bearer {key}"}
    assert f'URL = "{url}"' in shown["python"] and f'KEY = "{key}"' in shown["python"]
    fits(page, size)
    shot(page, tmp_path, f"agents-{size}")
    # The Python script runs as shown: the official client lists the gateway's tools with that key.
    listed = subprocess.run([sys.executable, "-c", shown["python"]], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert "get_user" in listed.stdout and "search_tweets" in listed.stdout

    # Another key chosen: the first one's secret leaves the page.
    chooser.select_option(label=f"spare ({spare}…)")
    expect(page.get_by_test_id("agents-reveal")).to_have_text("Show key")
    assert key not in page.locator("#view-agents").inner_text()

    # A tool call of an agent, and a REST call: the request log tells them apart and filters each.
    result = mcp_call(url, key, "get_user", {"user_name": user_name})
    assert not result.is_error, result
    assert data_call(stack, key, user_name) == 200
    page.get_by_role("link", name="Usage").click()
    rows = page.get_by_test_id("usage-row")
    expect(rows).to_have_count(2)
    expect(rows.filter(has_text="MCP · get_user")).to_have_count(1)
    expect(rows.filter(has_text="MCP · get_user")).to_contain_text("/user/info")
    page.get_by_test_id("log-via").select_option("mcp")
    page.get_by_test_id("log-search").click()
    expect(rows).to_have_count(1)
    expect(rows).to_contain_text("MCP · get_user")
    fits(page, size)
    shot(page, tmp_path, f"usage-mcp-{size}")
    page.get_by_test_id("log-via").select_option("rest")
    page.get_by_test_id("log-search").click()
    expect(rows).to_have_count(1)
    expect(rows).not_to_contain_text("MCP")
    w.check()
