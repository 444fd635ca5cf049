"""The harness the tests and the benchmarks run the service with, started the way users start it: gateway
processes, the sandbox provider and the database (`stack.py`); test settings, the JSON client, a gateway process
driven from the event loop, an SMTP inbox (`helpers.py`); and the pytest fixtures over them (`plugin.py`)."""
