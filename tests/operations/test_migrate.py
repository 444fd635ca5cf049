"""`migrate --to` as an operator runs it: from the embedded database of the README's first session to a second
server, then `serve` on the target carries on (docs/scale-out.md); a migrate onto the target while a gateway serves it
is refused, and a plain `serve` on the data directory migrated away refuses to serve its stale copy."""

import asyncio

import orjson
import pytest
from support import Gateway, cli

from app.embedded import EmbeddedMongo, free_port

pytestmark = pytest.mark.gen_test(timeout=120)


async def call(gw: Gateway, method: str, path: str, body=None, **headers) -> tuple[int, object]:
    response = await gw.call(method, path, body, **headers)
    return response.code, orjson.loads(response.body) if response.body else None


async def test_migrate_then_serve_on_the_target_carries_on_the_first_session(upstream_url, catalog, tmp_path):
    """The README's first session on the embedded database (DATA_DIR), then `migrate --to` a second server and
    `serve` with MONGODB_URI: the same token and key go on working, balance and usage identical."""
    data_dir = str(tmp_path / "var")
    gw = Gateway("", upstream_url, "social_gateway", DATA_DIR=data_dir)
    del gw.env["MONGODB_URI"]  # the embedded database in DATA_DIR, as the README's first session has it
    await gw.launch()
    status, user = await call(
        gw, "POST", "/auth/register", {"email": "me@example.com", "password": "a long passphrase"}
    )
    assert status == 200, user
    auth = {"Authorization": f"Bearer {user['token']}"}
    status, key = await call(gw, "POST", "/keys", {"name": "first"}, **auth)
    assert (await call(gw, "POST", f"/keys/{key['key_id']}/topup", {"credits": 100_000}, **auth))[0] == 200
    path = f"/social/user/info?userName={catalog['users'][0]['userName']}"
    for _ in range(3):
        assert (await gw.call("GET", path, **{"X-API-Key": key["key"]})).code == 200
    status, before = await call(gw, "GET", "/account", **auth)
    usage_before = (await call(gw, "GET", "/usage/summary", **auth))[1]

    target = EmbeddedMongo(str(tmp_path / "replica-set")).start()
    try:
        code, out, err = await cli("migrate", "--to", target.uri, DATA_DIR=data_dir)
        assert code == 1 and "stop it first" in err  # the gateway still serves on it
        await asyncio.to_thread(gw.stop)
        code, out, err = await cli("migrate", "--to", target.uri, DATA_DIR=data_dir)
        assert code == 0, out + err
        assert "verified" in out and "reconcile on the target: OK" in out

        on_target = await Gateway(target.uri, upstream_url, "social_gateway", DATA_DIR=data_dir).launch()
        gw = on_target  # the same JWT_SECRET and SECRETS_KEY: the session and the key are the ones issued before
        assert (await call(gw, "GET", "/account", **auth))[1]["credits"] == before["credits"]
        assert (await call(gw, "GET", "/usage/summary", **auth))[1] == usage_before
        response = await gw.call("GET", path, **{"X-API-Key": key["key"]})
        assert response.code == 200
        assert (await call(gw, "GET", "/account", **auth))[1]["credits"] < before["credits"]
        # Issue 46 (11): a second migrate --force onto the target the gateway now serves would replace its data.
        code, out, err = await cli("migrate", "--to", target.uri, "--force", DATA_DIR=data_dir)
        assert code == 1 and len(err.strip().splitlines()) == 1, out + err
        assert err.startswith("social-gateway: migrate: a gateway serves the target database social_gateway")
        await asyncio.to_thread(on_target.stop)
        assert (await cli("reconcile", MONGODB_URI=target.uri, MONGODB_DB="social_gateway"))[0] == 0

        # Issue 47 (11): `serve` as before, on the data directory migrated away, refuses its stale copy, naming the
        # target; told otherwise (ALLOW_MIGRATED_DB), it serves and says so.
        code, out, err = await cli("serve", "--port", str(free_port()), DATA_DIR=data_dir, UPSTREAM_URL=upstream_url)
        assert code == 1 and len(err.strip().splitlines()) == 1, out + err
        assert f"was migrated to 127.0.0.1:{target.port} (database social_gateway)" in err
        assert "serve with MONGODB_URI set to the target, or set ALLOW_MIGRATED_DB=true" in err
        stale = Gateway("", upstream_url, "social_gateway", DATA_DIR=data_dir, ALLOW_MIGRATED_DB="true")
        del stale.env["MONGODB_URI"]
        with open(tmp_path / "stale.log", "w") as fh:
            stale.stderr = fh
            await stale.launch()
        await asyncio.to_thread(stale.stop)
        assert "serving it anyway (ALLOW_MIGRATED_DB)" in (tmp_path / "stale.log").read_text()
    finally:
        target.stop()
