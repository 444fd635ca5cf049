"""Periodic background work, shared by the lease maintenance, the admin rollups and the payment reconciler."""
import asyncio
import logging
from typing import Awaitable, Callable


async def every(interval: float, step: Callable[[], Awaitable[object]], what: str, log: logging.Logger) -> None:
    """Runs `step` every `interval` seconds until cancelled; a failed step is logged (no exception text
    beyond its type) and tried again next time."""
    while True:
        await asyncio.sleep(interval)
        try:
            await step()
        except Exception as exc:
            log.warning("%s failed (%s); retrying next interval", what, type(exc).__name__)
