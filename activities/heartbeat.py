"""Heartbeating while an activity waits, so a dead worker is noticed (heartbeat timeout)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from temporalio import activity

HEARTBEAT_EVERY = 2.0
"""Seconds between heartbeats; well under every activity's heartbeat timeout."""


@contextlib.asynccontextmanager
async def heartbeating() -> AsyncIterator[None]:
    """Heartbeat every few seconds while the body waits.

    Not at once: a heartbeat per short line would be a server write per line."""

    async def beat() -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_EVERY)
            activity.heartbeat()

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
