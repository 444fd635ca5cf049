"""Real time: filter rules and account monitors polled under leases, their events written once, pushed to
WebSockets (hub.py) and webhooks (webhooks/). docs/streams.md describes the contracts."""
