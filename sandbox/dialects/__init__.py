"""Dialects: the same deterministic world, answered in the shapes, paths, status codes and error bodies of one
kind of provider. `twitterapi` (the default) is the provider the spec resells (sandbox/app.py's ProviderHandler);
`socialdata` is SocialData's Twitter v1.1-style API (socialdata.py). A dialect is a ProviderHandler subclass:
its `_answer(path)` reads the request its way and renders the world's records its way, reusing the world's
endpoints (sandbox/endpoints.py) for everything that is not a matter of shape.

Adding a dialect is one module here and a line in `handler`."""

from __future__ import annotations

import tornado.web

DIALECTS = ("twitterapi", "socialdata")


def handler(dialect: str) -> type[tornado.web.RequestHandler]:
    """The handler class of a dialect's provider paths. Raises ValueError for an unknown one."""
    if dialect == "twitterapi":
        from sandbox.app import ProviderHandler

        return ProviderHandler
    if dialect == "socialdata":
        from sandbox.dialects.socialdata import SocialDataHandler

        return SocialDataHandler
    raise ValueError(f"unknown dialect {dialect!r}: one of {', '.join(DIALECTS)}")
