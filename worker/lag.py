"""Event-loop lag of a worker: how late a periodic wake-up runs (everything on the loop waits
that long: activity heartbeats, upstream responses, the SDK's completions).

Off by default; `BACKFILL_WORKER_LOOP_LAG_LOG_SECONDS=N` logs p50/p99/max every N seconds."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

INTERVAL_S = 0.05
"""Seconds between wake-ups; each sample is how much later than that it ran."""


@dataclass
class LoopLag:
    samples: list[float] = field(default_factory=list)
    """Lags in seconds since the last `take()`."""

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            t = loop.time()
            await asyncio.sleep(INTERVAL_S)
            self.samples.append(max(0.0, loop.time() - t - INTERVAL_S))

    def take(self) -> dict[str, float]:
        """p50, p99 and max lag in ms of the samples so far (and forget them)."""
        s, self.samples = sorted(self.samples), []
        if not s:
            return {"samples": 0, "p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0}
        pick = lambda q: round(1000 * s[min(len(s) - 1, int(q * len(s)))], 1)  # noqa: E731
        return {"samples": len(s), "p50_ms": pick(0.5), "p99_ms": pick(0.99), "max_ms": pick(1)}


@contextlib.asynccontextmanager
async def measuring() -> AsyncIterator[LoopLag]:
    """A LoopLag sampling this loop for the body of the `with`."""
    lag = LoopLag()
    task = asyncio.create_task(lag.run())
    try:
        yield lag
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def log_every(seconds: float) -> None:
    """Log the loop's lag every `seconds` (a task for the worker's lifetime)."""
    async with measuring() as lag:
        while True:
            await asyncio.sleep(seconds)
            log.info("event loop lag: %s", lag.take())
