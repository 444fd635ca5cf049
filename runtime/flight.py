"""One operation per key at a time: callers arriving while it runs wait for it instead of starting their own."""

import asyncio


async def single_flight(under_way: dict, key, operation) -> None:
    """Runs `operation` unless one is under way for `key` in `under_way`, in which case it waits for that
    one instead; the registry holds the future while it runs (Meter.close() waits for what it holds)."""
    pending = under_way.get(key)
    if pending is not None:
        return await asyncio.shield(pending)
    future = under_way[key] = asyncio.get_running_loop().create_future()
    try:
        await operation()
        future.set_result(None)
    except BaseException as exc:
        future.set_exception(exc)
        future.exception()  # retrieved: no "exception never retrieved" when nobody waited
        raise
    finally:
        del under_way[key]
