"""The webhook delivery engine: the outbox in MongoDB (through storage/webhooks.py), Standard Webhooks
signing (`signing.py`), the SSRF guard (`guard.py`), one HTTP attempt (`sender.py`), email
(`mail.py`) and the dispatcher with its retry schedule (`outbox.py`). It knows events, not what they mean:
alerts/ decides when an event exists."""
