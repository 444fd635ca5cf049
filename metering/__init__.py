"""The metering core: rate limiter, credit ledger, usage buffer, prices and plans.

Plain Python with no I/O in its decisions: callers pass the clock in, and the
storage layer persists what these objects decide.
"""
