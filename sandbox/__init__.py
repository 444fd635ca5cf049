"""Sandbox upstream: a deterministic, simulated social-data provider (see README.md)."""
from .app import make_app
from .server import SandboxServer, main, start

__all__ = ["SandboxServer", "main", "make_app", "start"]
