"""The settings as people read them, rendered from their declarations (config/settings.py): the table
`social-gateway --help` prints, and docs/configuration.md (`./dev settings-doc` writes it; tests/operations/test_settings.py
fails when it is not what the declarations say)."""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys
from typing import Any

import orjson

from config.declare import default_of
from config.settings import fields

DOC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
INTRO = """\
# Configuration

Every setting of the gateway, grouped as `social-gateway serve --help` prints them. Back to the [README](../README.md).

Every setting is an environment variable (a TOML file named by `CONFIG_FILE` may set the same names in lower case;
the environment wins). `serve` checks each against its bounds at start and lists every problem in one message
(exit 2). This page is generated from the declarations in `config/settings.py` by `./dev settings-doc`.
"""


def groups() -> dict[str, list[dataclasses.Field]]:
    """The settings by group, in the order they are declared."""
    grouped: dict[str, list[dataclasses.Field]] = {}
    for f in fields():
        grouped.setdefault(f.metadata["group"], []).append(f)
    return grouped


def describe() -> str:
    """The settings table printed by --help."""
    lines = ["settings (environment variables; CONFIG_FILE may name a TOML file with the same names in lower case):"]
    for group, members in groups().items():
        lines += ["", f"{group}:"]
        for f in members:
            bounds = f.metadata["bounds"].words()
            shown = f"default: {_plain(default_of(f))!r}" + (f"; {bounds}" if bounds else "")
            lines.append(f"  {f.metadata['env']:<26} {f.metadata['help']} ({shown})")
    return "\n".join(lines)


def markdown() -> str:
    """docs/configuration.md: one table per group."""
    out = [INTRO]
    for group, members in groups().items():
        out += [f"## {group}", "", "| Variable | Default | Allowed | Meaning |", "|---|---|---|---|"]
        for f in members:
            cells = (f"`{f.metadata['env']}`", _default(f), f.metadata["bounds"].words(), f.metadata["help"])
            out.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
        out.append("")
    return "\n".join(out)


def _plain(value: Any) -> Any:
    """A default as an operator would write it: a list of objects as its JSON."""
    if isinstance(value, tuple) and value and isinstance(value[0], dict):
        return orjson.dumps(list(value)).decode()
    return value


def _default(f: dataclasses.Field) -> str:
    value = _plain(default_of(f))
    if value in ("", (), {}):
        return "*(empty)*"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, tuple):
        return f"`{orjson.dumps(list(value)).decode()}`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # 30.0 reads 30
    return f"`{value}`" + _unit(f.name, value)


def _unit(name: str, value: Any) -> str:
    """A large default in words: bytes as KiB or MiB, seconds as hours or days."""
    if not isinstance(value, int) or value < 3600:
        return ""
    if name.endswith("_bytes") and value % 1024 == 0:
        return f" ({value // 1024**2} MiB)" if value % 1024**2 == 0 else f" ({value // 1024} KiB)"
    seconds = "seconds" in name or name.endswith(("_ttl", "_timeout", "_for", "_after", "_retention", "_interval"))
    if seconds and value % 86400 == 0:
        return f" ({value // 86400} day{'s' if value > 86400 else ''})"
    if seconds and value % 3600 == 0:
        return f" ({value // 3600} hour{'s' if value > 3600 else ''})"
    return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./dev settings-doc", description="Write docs/configuration.md.")
    parser.add_argument("--check", action="store_true", help="exit 1 if the file differs instead of writing it")
    args = parser.parse_args(argv)
    if args.check:
        same = DOC.exists() and DOC.read_text() == markdown()
        print(f"{DOC} is {'up to date' if same else 'out of date: ./dev settings-doc'}", file=sys.stderr)
        return 0 if same else 1
    DOC.write_text(markdown())
    print(f"wrote {DOC}", file=sys.stderr)
    return 0
