"""Settings: declared once, read from a TOML file and the environment (which wins), validated at start."""

import subprocess
import sys

import pytest

import config
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
