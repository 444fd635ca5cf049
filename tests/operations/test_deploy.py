"""The deployment files an operator takes as they are: deploy/compose.yaml's gateway starts, with its
own production settings, as the command it names, behind the nginx configuration compose mounts; the
nginx files pass `nginx -t` and never replay a call; the alert rules pass `promtool check rules`; and
every metric the rules and the Grafana dashboard read is one the gateway serves."""

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import uuid

import orjson
import pytest
import yaml  # PyYAML: installed with openapi-spec-validator
from support import Gateway, account_with_keys
from tornado.httpclient import AsyncHTTPClient

import config
from app.embedded import free_port
from gateway_testing.stack import wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/<area>/ -> the project
DEPLOY = os.path.join(ROOT, "deploy")
COMPOSE = yaml.safe_load(open(os.path.join(DEPLOY, "compose.yaml")))
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
pytestmark = pytest.mark.gen_test(timeout=120)


def test_compose_file_is_complete():
    services = COMPOSE["services"]
    assert services["mongo"]["image"].startswith("mongo:") and "--replSet" in services["mongo"]["command"]
    assert "rs.initiate" in " ".join(services["mongo"]["healthcheck"]["test"])
    assert services["gateway"]["depends_on"]["mongo"]["condition"] == "service_healthy"
    # The gateway's settings pass the production start-up check as they are written.
    env = {k: str(v) for k, v in services["gateway"]["environment"].items()}
    settings = config.load(env, serving=True)
    assert settings.production and "replicaSet=rs0" in settings.mongodb_uri and settings.log_format == "json"
    mounted = services["nginx"]["volumes"][0].split(":")[0]
    assert os.path.exists(os.path.join(DEPLOY, mounted))
    if shutil.which("docker-compose"):  # the compose schema itself, where the client is installed
        checked = subprocess.run(["docker-compose", "-f", "deploy/compose.yaml", "config", "-q"], cwd=ROOT)
        assert checked.returncode == 0


def test_the_image_copies_every_package_the_service_imports():
    """The Dockerfile names each folder it builds the wheel from: a package left out is missing from the image, and
    `serve` fails there at its first import (alerts/, streams/ and webhooks/ once were)."""
    dockerfile = open(os.path.join(ROOT, "Dockerfile")).read()
    copied = set(re.findall(r"^COPY (\w+) \1$", dockerfile, re.M))
    packages = {p for p in os.listdir(ROOT) if os.path.exists(os.path.join(ROOT, p, "__init__.py"))}
    assert packages - {"tests", "bench", "gateway_testing"} <= copied, sorted(packages - copied)


def nginx_test(text: str, tmp_path) -> subprocess.CompletedProcess:
    """`nginx -t` of a file meant for the http {} block (TLS lines taken out: no certificate here)."""
    text = re.sub(r"listen 443 ssl;", f"listen 127.0.0.1:{free_port()};", text)
    text = "\n".join(line for line in text.splitlines() if not line.strip().startswith("ssl_"))
    (tmp_path / "site.conf").write_text(text)
    (tmp_path / "nginx.conf").write_text(
        f"pid {tmp_path}/nginx.pid; error_log {tmp_path}/error.log; events {{}}\n"
        f"http {{ access_log off; include {tmp_path}/site.conf; }}\n"
    )
    return subprocess.run([NGINX, "-t", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf")], capture_output=True)


@pytest.mark.skipif(not os.path.exists(NGINX), reason="nginx is not installed")
@pytest.mark.parametrize("name", ["nginx.conf", "nginx-scaleout.conf"])
def test_nginx_files_are_valid_at_parity_and_never_replay(name, tmp_path):
    text = open(os.path.join(DEPLOY, name)).read()
    checked = nginx_test(text.replace("/etc/letsencrypt", str(tmp_path)), tmp_path)
    assert checked.returncode == 0, checked.stderr
    directives = {line.strip() for line in text.splitlines()}
    for needed in (
        "location = /metrics { return 404; }",
        "proxy_set_header X-Request-ID $gateway_request_id;",
        "client_body_timeout     10s;",
        "client_header_timeout   10s;",
        "proxy_next_upstream off;",
    ):
        assert needed in directives, needed
    assert not re.search(r"proxy_next_upstream +(error|timeout)", text)


@pytest.mark.skipif(not shutil.which("promtool"), reason="promtool (Debian: prometheus) is not installed")
def test_alert_rules_pass_promtool():
    checked = subprocess.run(["promtool", "check", "rules", os.path.join(DEPLOY, "monitoring", "alerts.yaml")])
    assert checked.returncode == 0


def read_metric_names() -> set[str]:
    """Every gateway_* name the alert rules and the dashboard query."""
    rules = yaml.safe_load(open(os.path.join(DEPLOY, "monitoring", "alerts.yaml")))
    exprs = [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    dashboard = json.load(open(os.path.join(DEPLOY, "monitoring", "grafana-dashboard.json")))
    exprs += [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    return {name for expr in exprs for name in re.findall(r"\b(?:gateway|process)_[a-z_]+", expr)}


@pytest.mark.skipif(not os.path.exists(NGINX), reason="nginx is not installed")
async def test_compose_gateway_behind_its_nginx(mongo, upstream_url, catalog, tmp_path):
    """The compose gateway's command and settings (production, two workers, METRICS_PORT), behind the nginx
    configuration compose mounts: calls pass with their request id, /metrics does not, and the metrics
    port answers for both workers with every series the rules and the dashboard read."""
    command = COMPOSE["services"]["gateway"]["command"]
    assert command == ["serve", "--workers", "2"]  # what GatewayProcess runs with workers=2
    metrics_port = free_port(2)  # one port per worker
    env = {k: str(v) for k, v in COMPOSE["services"]["gateway"]["environment"].items()}
    del env["MONGODB_URI"], env["UPSTREAM_URL"], env["UPSTREAM_API_KEY"]  # this machine's database and provider
    env.update(METRICS_PORT=str(metrics_port), TRUSTED_PROXIES="127.0.0.1")  # nginx on loopback
    gw = Gateway(mongo.uri, upstream_url, f"c_{uuid.uuid4().hex[:10]}", workers=2, **env)
    await gw.launch()
    site = open(os.path.join(DEPLOY, "compose", "nginx.conf")).read()
    edge = free_port()
    site = site.replace("gateway:8000", f"127.0.0.1:{gw.port}").replace("listen 80;", f"listen 127.0.0.1:{edge};")
    assert nginx_test(site, tmp_path).returncode == 0
    nginx = subprocess.Popen([NGINX, "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf"), "-g", "daemon off;"])
    try:
        gw.port = edge  # every call from here goes through nginx
        await asyncio.to_thread(wait_for, gw.url + "/healthz", nginx, 30)
        _, keys, auth = await account_with_keys(gw, 0, 1)
        # Production has no top-up of its own: credits from the operator's command, on the same database.
        email = orjson.loads((await gw.call("GET", "/account", **auth)).body)["email"]
        credit = [os.path.join(os.path.dirname(sys.executable), "social-gateway"), "admin", "credit", email, "100000"]
        credited = subprocess.run(credit, env={**gw.env, "GATEWAY_ENV": "development"}, capture_output=True, timeout=60)
        assert credited.returncode == 0, credited.stderr
        path = f"/social/user/info?userName={catalog['users'][0]['userName']}"
        for number in range(6):
            answer = await gw.call("GET", path, **{"X-API-Key": keys[0], "X-Request-ID": f"edge-{number}"})
            assert answer.code == 200 and answer.headers["X-Request-ID"] == f"edge-{number}"
        assert (await gw.call("GET", "/metrics")).code == 404
        scraped = await AsyncHTTPClient().fetch(f"http://127.0.0.1:{metrics_port}/metrics")
        text = scraped.body.decode()
        assert (
            text.count('gateway_scrape_worker_up{worker="') == 2 and 'gateway_scrape_worker_up{worker="1"} 1.0' in text
        )
        served = re.findall(
            r'^gateway_requests_total\{route="/social/user/info",status="200",worker="\d"\} (\S+)$', text, re.M
        )
        assert sum(float(v) for v in served) == 6
        for name in read_metric_names():
            assert re.search(rf"^{name}[{{ ]", text, re.M), f"{name}: read by the alert rules or dashboard, not served"
    finally:
        nginx.send_signal(signal.SIGQUIT)
        nginx.wait(10)
        assert gw.stop() == 0
