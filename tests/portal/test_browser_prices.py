"""Money a customer can see before and after spending (issue 47, items 7 and 8), in a real browser at a desktop's
1280×800 and a phone's 390×844: the Prices view shows the running price rules (this gateway's PRICE_RULES, not the
defaults) with each endpoint's cache freshness (its CACHE_TTL), and the usage view totals what the answer cache
saved over the period and, per endpoint, the calls it answered. Each fails on a page wider than the screen. The
browser helpers are tests/portal/test_browser.py's; this module runs its own gateway, with the answer cache on."""

import json

import pytest
import test_browser
from test_browser import expect, register, shot
from test_browser_security import SIZES, fits, opened

from gateway_testing.stack import Stack, request

pytestmark = test_browser.pytestmark  # skipped, with the reason, without Chromium
browser, watched = test_browser.browser, test_browser.watched  # the same fixtures, on this module's stack
PROFILE = 21  # this gateway's price of a profile (the default is 18): the view shows the running rules


@pytest.fixture(scope="module")
def stack():
    env = {
        "SIGNUP_CREDITS": str(test_browser.SIGNUP_CREDITS),  # what test_browser.register expects to see
        "SIGNUP_CREDITED_PER_NETWORK": "1000000",
        "PRICE_RULES": json.dumps({"profiles": {"each": PROFILE}}),
        "CACHE_MAX_BYTES": str(8 * 1024 * 1024),
        "CACHE_TTL": json.dumps({"user/info": 1800}),
    }
    with Stack(in_memory=True, gateway_env=env) as running:
        yield running


@pytest.mark.parametrize("size", SIZES)
def test_the_prices_view_shows_the_running_price_rules_and_cache_freshness(watched, stack, size, tmp_path):
    w = opened(watched, size)
    page = w.page
    register(page, stack)
    page.get_by_role("link", name="Prices").click()
    expect(page.locator("#view-prices")).to_be_visible()
    info = page.get_by_test_id("price-row").filter(has_text="/social/user/info")
    expect(info).to_have_count(1)
    expect(info).to_contain_text(f"{PROFILE} per profile")
    expect(info).to_contain_text("30 min")  # CACHE_TTL's 1800 s
    followers = page.get_by_test_id("price-row").filter(has_text="/social/user/followers_ids")
    expect(followers).to_contain_text("0.45 per id at count 4,000 or more")
    expect(followers).to_contain_text("10 min")  # the default 600 s
    expect(page.get_by_test_id("prices-terms")).to_contain_text("100,000 credits = 1 USD")
    expect(page.get_by_test_id("prices-terms")).to_contain_text("costs nothing")  # CACHE_HIT_PRICE 0
    fits(page, size)
    shot(page, tmp_path, f"prices-{size}")
    w.check()


@pytest.mark.parametrize("size", SIZES)
def test_usage_totals_the_credits_the_cache_saved_and_the_calls_it_answered(watched, stack, size, tmp_path):
    w = opened(watched, size)
    page = w.page
    register(page, stack)
    key = test_browser.create_key(page)
    user_name = request("GET", stack.upstream + "/sandbox/catalog")[1]["users"][0]["userName"]
    url = f"{stack.url}/social/user/info?userName={user_name}"
    # A live read first (the other width's test may have the answer kept already), then two repeats from the cache.
    answers = [request("GET", url, None, {"X-API-Key": key, "Cache-Control": "no-cache"})]
    answers += [request("GET", url, None, {"X-API-Key": key}) for _ in range(2)]
    heads = [{name.lower(): value for name, value in a[2].items()} for a in answers]
    assert [h["x-cache"] for h in heads] == ["MISS", "HIT", "HIT"]
    assert [h["x-credits-charged"] for h in heads] == [str(PROFILE), "0", "0"]

    page.get_by_role("link", name="Usage").click()
    saved = page.get_by_test_id("usage-saved")
    expect(saved).to_have_text(
        f"Saved by the cache in the last 7 days: {2 * PROFILE} credits (2 calls answered from the cache)."
    )
    row = page.get_by_test_id("endpoint-row").filter(has_text="/user/info")
    expect(row.get_by_test_id("endpoint-from-cache")).to_have_text(f"2 saved {2 * PROFILE}")
    fits(page, size)
    shot(page, tmp_path, f"usage-saved-{size}")
    w.check()
