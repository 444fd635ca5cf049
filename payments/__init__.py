"""Crypto top-ups: processors (NOWPayments, the sandbox chain), crediting, reconciliation.

Entry point: payments.service.build_payments, which gateway.build_context turns into ctx.payments.
"""
