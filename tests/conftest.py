"""The fixtures are the gateway_testing plugin's (gateway_testing/plugin.py): the database, the sandbox upstream,
the application under test and its JSON client (`api`), gateways as processes. What the tests share besides
fixtures is in tests/support.py. The stream tests' scripted provider is the one fixture of their own here."""

import pytest
from support import SearchProvider, use_upstream

pytest_plugins = ["gateway_testing.plugin"]


@pytest.fixture
def provider(ctx):
    """The stream tests' scripted search provider, in place of the sandbox for the context and its poller."""
    scripted = SearchProvider()
    use_upstream(ctx, scripted.url)
    ctx.poller.upstream = ctx.upstream
    yield scripted
    scripted.stop()
