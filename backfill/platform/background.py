"""The loop every background reporter and poller of the api and the worker runs on: tasks
started together and stopped together, and a wait for a change or the next tick.

Used by the api's live reporter, preemption sender and console sampler, and the worker's
preemption peers, policy reader and held-back reporter: each one's own logic stays in its module,
the task handling is here once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any


class Background:
    """Tasks of one owner: `start` creates them, `stop` cancels every one and waits for each."""

    def __init__(self) -> None:
        self.tasks: list[asyncio.Task[Any]] = []

    def start(self, *loops: Coroutine[Any, Any, Any]) -> None:
        self.tasks += [asyncio.create_task(loop) for loop in loops]

    async def stop(self, *others: asyncio.Task[Any]) -> None:
        """Cancel the tasks (and `others`, tasks the owner started one by one), then wait for
        each to end."""
        tasks = [*self.tasks, *others]
        self.tasks = []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def woken(wake: asyncio.Event, seconds: float) -> None:
    """Wait until `wake` is set or `seconds` pass, whichever comes first; `wake` is clear after."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await wake.wait()
    wake.clear()
