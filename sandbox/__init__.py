"""Sandbox upstream: a deterministic, simulated social-data provider (see README.md)."""

from .app import make_app
from .server import SandboxServer, add_arguments, main, run, start

__all__ = ["SandboxServer", "add_arguments", "main", "make_app", "run", "start"]
