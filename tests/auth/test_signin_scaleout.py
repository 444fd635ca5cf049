"""Sign-in promises against a served gateway with `--workers 2` (docs/security.md, "Account security"): the
password-reset emails of an address are limited across processes, and a two-factor challenge opens one
session, whichever worker a second use reaches."""

import asyncio
import itertools
import time
import uuid
from collections import Counter

import orjson
import pyotp
import pytest
from support import Gateway

pytestmark = pytest.mark.gen_test(timeout=180)
PASSWORD = "served sign-in pass"


def worker_of(response) -> str:
    """Which worker answered: a generated request id starts with that process's prefix (handlers/base.py)."""
    return response.headers["X-Request-Id"][:12]


async def registered(gw: Gateway) -> tuple[str, dict]:
    email = f"r{uuid.uuid4().hex[:8]}@example.com"
    response = await gw.call("POST", "/auth/register", {"email": email, "password": PASSWORD})
    assert response.code == 200, response.body
    return email, {"Authorization": f"Bearer {orjson.loads(response.body)['token']}"}


async def test_reset_emails_of_an_address_are_limited_across_workers(mongo, upstream_url, inbox):
    gw = Gateway(
        mongo.uri,
        upstream_url,
        f"r_{uuid.uuid4().hex[:10]}",
        workers=2,
        SMTP_URL=f"smtp://127.0.0.1:{inbox.port}",
        PUBLIC_URL="https://portal.example.com",
        # Each worker counts an address's attempts on its own (20 a minute): the workers share one listening
        # socket, and the kernel may hand most connections to one of them, which then refuses the rest before
        # the other has taken its 4. This test is about the emails' limit, the attempts' is test_security's.
        LOGIN_MAX_ATTEMPTS_PER_ADDRESS="100000",
    )
    await gw.launch()
    email, _ = await registered(gw)
    accepted: Counter = Counter()
    for _ in range(400):  # one connection each: until each worker has taken more than the limit's 3
        response = await gw.call("POST", "/auth/password/forgot", {"email": email})
        assert response.code in (202, 429), response.body
        if response.code == 202:
            accepted[worker_of(response)] += 1
        if len(accepted) == 2 and min(accepted.values()) >= 4:
            break
    assert len(accepted) == 2 and min(accepted.values()) >= 4, f"the kernel sent the requests to one worker: {accepted}"
    await inbox.until(3)
    await asyncio.sleep(2.0)  # every worker's sends had their time: none may follow
    # Invariant: 3 emails an hour per address, whatever the number of processes (each allowed 3 before).
    assert len(inbox.messages) == 3, [m["to"] for m in inbox.messages]
    assert all(m["to"] == [email] for m in inbox.messages)


async def test_a_two_factor_challenge_opens_one_session_across_workers(mongo, upstream_url):
    gw = await Gateway(mongo.uri, upstream_url, f"c_{uuid.uuid4().hex[:10]}", workers=2).launch()
    email, auth = await registered(gw)
    setup = orjson.loads((await gw.call("POST", "/auth/2fa/setup", {"password": PASSWORD}, **auth)).body)
    totp = pyotp.TOTP(setup["secret"])
    enabled = await gw.call("POST", "/auth/2fa/enable", {"code": totp.now()}, **auth)
    assert enabled.code == 200, enabled.body
    recovery = orjson.loads(enabled.body)["recovery_codes"]
    first = await gw.call("POST", "/auth/login", {"email": email, "password": PASSWORD})
    challenge = orjson.loads(first.body)["challenge"]
    used = await gw.call("POST", "/auth/login/2fa", {"challenge": challenge, "code": totp.at(time.time() + 30)})
    assert used.code == 200 and orjson.loads(used.body)["token"], used.body
    # Within its 5 minutes, with a code that is valid on its own (an unused recovery code), through both
    # workers: the challenge was spent by its first use.
    workers = {worker_of(used)}
    for spare in itertools.islice(itertools.cycle(recovery), 200):  # a refused use spends no code: reusable
        again = await gw.call("POST", "/auth/login/2fa", {"challenge": challenge, "code": spare})
        body = orjson.loads(again.body)
        assert again.code == 401 and "token" not in body, body
        assert body["detail"] == "This sign-in was already completed; enter your email and password again", body
        workers.add(worker_of(again))
        if len(workers) == 2:
            break
    assert len(workers) == 2, "every request reached one worker"
    # The spare codes were not spent by the refused uses: a new sign-in takes one.
    fresh = orjson.loads((await gw.call("POST", "/auth/login", {"email": email, "password": PASSWORD})).body)
    done = await gw.call("POST", "/auth/login/2fa", {"challenge": fresh["challenge"], "code": recovery[0]})
    assert done.code == 200, done.body
