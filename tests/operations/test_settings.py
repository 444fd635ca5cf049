"""Settings: declared once with their group and bounds, read from a TOML file and the environment (which wins),
validated at start against the declarations, documented from them."""

import os
import subprocess
import sys

import orjson
import pytest

import config
from config import reference
from config.settings import fields


def test_environment_wins_over_the_config_file(tmp_path):
    path = tmp_path / "gateway.toml"
    path.write_text('signup_credits = 500\nupstream_path_prefix = "/v2"\n')
    settings = config.load({"CONFIG_FILE": str(path), "SIGNUP_CREDITS": "7"})
    assert settings.signup_credits == 7 and settings.upstream_path_prefix == "/v2"


@pytest.mark.parametrize(
    "content,message",
    [
        ("price_rules = {minimum: 20}\n", "CONFIG_FILE"),  # not TOML
        ("no_such_setting = 1\n", "unknown settings"),
    ],
)
def test_a_bad_config_file_is_refused_with_a_reason(tmp_path, content, message):
    path = tmp_path / "gateway.toml"
    path.write_text(content)
    with pytest.raises(config.SettingsError, match=message):
        config.load({"CONFIG_FILE": str(path)})


@pytest.mark.parametrize(
    "environ,message",
    [
        ({"GATEWAY_ENV": "staging"}, "GATEWAY_ENV"),
        ({"GATEWAY_ENV": "production"}, "required in production"),
        ({"JWT_SECRET": "short"}, "at least 32"),
        ({"GATEWAY_PORT": "eighty"}, "GATEWAY_PORT"),
        ({"TWITTER_ALIAS": "maybe"}, "TWITTER_ALIAS"),
        ({"PLAN_RULES": '[{"name": "x", "qps": 5}]'}, "PLAN_RULES"),
        ({"PRICE_RULES": '{"tweets": {"each": "15"}}'}, "PRICE_RULES"),
        ({"UPSTREAM_PATH_PREFIX": "twitter"}, "UPSTREAM_PATH_PREFIX"),
        ({"EVENT_LOOP": "trio"}, "EVENT_LOOP must be asyncio or uvloop"),
        ({"EMBEDDED_DB_NICE": "20"}, "EMBEDDED_DB_NICE must be between 0 and 19"),
        ({"DB_EXPIRY_SECONDS": "-1"}, "DB_EXPIRY_SECONDS must be 0"),
        ({"IDEMPOTENCY_TTL": "0"}, "IDEMPOTENCY_TTL must be at least 1"),
        ({"IDEMPOTENCY_MAX_BODY_BYTES": "0"}, "IDEMPOTENCY_MAX_BODY_BYTES must be at least 1"),
    ],
)
def test_invalid_settings_stop_the_start(environ, message):
    with pytest.raises(config.SettingsError, match=message):
        config.load(environ)


def test_settings_are_immutable():
    settings = config.load({})
    with pytest.raises(AttributeError):
        settings.port = 1


def test_help_documents_every_setting_and_a_bad_one_exits_2():
    run = lambda *args, **env: subprocess.run(
        [sys.executable, "gateway.py", *args], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", **env}
    )
    shown = run("serve", "--help")
    assert shown.returncode == 0
    for f in fields():
        assert f.metadata["env"] in shown.stdout, f.name
    refused = run("serve", GATEWAY_ENV="production")
    assert refused.returncode == 2 and "required in production" in refused.stderr


# --- each setting's bounds declared with it (config/declare.py), its page generated from the declarations --------
def out_of_bounds(bounds) -> str | None:
    """A value the declaration refuses, as an operator would write it (None: no numeric bound or choice to cross)."""
    if bounds.choices:
        return "no-such-choice"
    if bounds.at_least is not None:
        return str(bounds.at_least - 1)
    if bounds.above is not None:
        return str(bounds.above)
    return None if bounds.at_most is None else str(bounds.at_most + 1)


@pytest.mark.parametrize("f", [f for f in fields() if out_of_bounds(f.metadata["bounds"])], ids=lambda f: f.name)
def test_every_declared_bound_stops_the_start(f):
    env = f.metadata["env"]
    with pytest.raises(config.SettingsError) as refused:
        config.load({env: out_of_bounds(f.metadata["bounds"])})
    assert any(problem.startswith(f"{env} ") for problem in refused.value.problems), refused.value.problems


def test_every_setting_has_a_group_and_help_prints_them_by_group():
    shown = subprocess.run(
        [sys.executable, "gateway.py", "serve", "--help"], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}
    ).stdout
    groups = {f.metadata["group"] for f in fields()}
    assert len(groups) > 10 and all(f"\n{group}:\n" in shown for group in groups)
    # Bounds are printed with the default: the operator reads what serve would refuse before starting it.
    assert "EMBEDDED_DB_NICE" in shown and "0 to 19" in shown.split("EMBEDDED_DB_NICE", 1)[1].split("\n", 1)[0]


def test_the_configuration_page_is_what_the_declarations_say():
    """docs/configuration.md is generated (`./dev settings-doc`); a setting added, changed or bounded without
    regenerating it fails here."""
    assert reference.DOC.read_text() == reference.markdown(), "docs/configuration.md is stale: run ./dev settings-doc"
    for f in fields():
        assert f"| `{f.metadata['env']}` |" in reference.DOC.read_text(), f.name


# --- the command line an operator meets (the installed console script) ------------------------------------
SCRIPT = os.path.join(os.path.dirname(sys.executable), "social-gateway")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/<area>/ -> the project
PRODUCTION = {
    "GATEWAY_ENV": "production",
    "GATEWAY_HOST": "0.0.0.0",
    "JWT_SECRET": "j" * 40,
    "SECRETS_KEY": "s" * 40,
    "UPSTREAM_URL": "http://127.0.0.1:9",
    "UPSTREAM_API_KEY": "provider-key",
}


def command(*args, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [SCRIPT, *args], capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin", **env}, cwd=ROOT
    )


def test_production_lists_every_missing_setting_in_one_start():
    refused = command("serve", GATEWAY_ENV="production")
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.startswith("social-gateway: 5 problems with the settings:\n")
    for name in ("JWT_SECRET and SECRETS_KEY", "GATEWAY_HOST", "UPSTREAM_URL", "UPSTREAM_API_KEY", "MONGODB_URI"):
        assert f"  - {name}" in refused.stderr, name
    bad_values = command("serve", GATEWAY_ENV="production", GATEWAY_PORT="eighty", LOG_FORMAT="xml", LOG_LEVEL="LOUD")
    for name in ("GATEWAY_PORT", "LOG_FORMAT must be json or text", "LOG_LEVEL must be"):
        assert name in bad_values.stderr, name


def test_production_without_mongodb_uri_needs_allow_embedded_db():
    refused = command("serve", **PRODUCTION)
    assert refused.returncode == 2
    assert refused.stderr.strip() == (
        "social-gateway: MONGODB_URI is required in production (the embedded database is one process on one "
        "disk); set ALLOW_EMBEDDED_DB=true to run on it anyway"
    )


def test_an_unreachable_database_is_one_line_naming_host_and_timeout():
    refused = command("serve", "--port", "0", **PRODUCTION, MONGODB_URI="mongodb://operator:pw@127.0.0.1:1/")
    assert refused.returncode == 1 and len(refused.stderr.strip().splitlines()) == 1
    assert "cannot reach MongoDB at 127.0.0.1:1 within 10 s" in refused.stderr and "pw" not in refused.stderr


def test_a_missing_extra_is_named():
    # The `embedded` extra not installed: secantus cannot be imported.
    hidden = "import sys; sys.modules['secantus'] = None; import gateway; sys.exit(gateway.main(['serve']))"
    refused = subprocess.run([sys.executable, "-c", hidden], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert refused.returncode == 2 and "pip install 'social-gateway[embedded]'" in refused.stderr


def test_version_help_and_dev_usage():
    version = command("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"social-gateway {config.VERSION}"
    shown = command("serve", "--help")
    for name in ("LOG_LEVEL", "LOG_FORMAT", "ALLOW_EMBEDDED_DB"):
        assert f"  {name} " in shown.stdout, name
    usage = subprocess.run([os.path.join(ROOT, "dev")], capture_output=True, text=True, timeout=60)
    assert usage.returncode == 0 and usage.stdout.startswith("usage: ./dev COMMAND")
    assert "invalid choice" not in usage.stderr


def test_json_logs_are_one_object_per_line():
    """LOG_FORMAT=json: even a refusal's log lines (here a warning at start) are JSON objects."""
    script = "import logging; from config import logs; logs.configure_from({'LOG_FORMAT': 'json'}); "
    script += "logging.getLogger('gateway').warning('hello %s', 'there', extra={'request_id': 'r-1'})"
    logged = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=60)
    line = orjson.loads(logged.stderr)
    assert list(line) == ["time", "level", "logger", "message", "request_id"]
    assert line["level"] == "WARNING" and line["message"] == "hello there" and line["time"].endswith("Z")
