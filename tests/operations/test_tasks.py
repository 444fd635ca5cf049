"""The background loops (app/tasks.py) end when cancelled, whatever their step does with the cancellation: a
step that swallowed it (or turned it into another error) sent the loop back to sleep, and a shutdown or a
test's teardown waited for it in vain ("background tasks ignored their cancellation")."""

import asyncio

import pytest

from app.tasks import every, when_told_or_every

pytestmark = pytest.mark.gen_test(timeout=30)


class Swallows(Exception):
    pass


def step_that(swallow: str, started: asyncio.Event):
    async def step() -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            if swallow == "raises":
                raise Swallows from None  # a driver turning a cancellation into its own error

    return step


@pytest.mark.parametrize("swallow", ["swallows", "raises"])
@pytest.mark.parametrize("loop", ["every", "when_told_or_every"])
async def test_a_loop_whose_step_swallows_its_cancellation_still_ends(loop, swallow):
    started = asyncio.Event()
    step = step_that(swallow, started)
    if loop == "every":
        work = every(0.001, step, "test step")
    else:
        told = asyncio.Event()
        told.set()
        work = when_told_or_every(told, 0.001, step, "test step")
    task = asyncio.create_task(work)
    await asyncio.wait_for(started.wait(), 10)
    task.cancel()
    done, _ = await asyncio.wait([task], timeout=10)
    assert done == {task} and task.cancelled()
