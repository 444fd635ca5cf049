"""The fixtures are the gateway_testing plugin's (gateway_testing/plugin.py): the database, the sandbox upstream,
the application under test and its JSON client (`api`), gateways as processes. What the tests share besides
fixtures is in tests/support.py."""

pytest_plugins = ["gateway_testing.plugin"]
