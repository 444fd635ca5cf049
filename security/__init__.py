"""Passwords, session tokens and API-key secrets: the service's cryptography in one place."""
