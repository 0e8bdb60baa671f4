"""Heartbeating while an activity waits, so a dead worker is noticed (heartbeat timeout)."""

from __future__ import annotations

import asyncio
import contextvars

from temporalio import activity

HEARTBEAT_SHARE = 0.5
"""A heartbeat every this share of the activity's heartbeat timeout (lines: 7 s, so every 3.5 s).
A line answered sooner never heartbeats: at 2 s lines and 256 in flight, a heartbeat per line
was a server call per line (about 128/s) that the bare baseline does not pay."""
HEARTBEAT_EVERY = 4.0
"""Seconds between heartbeats of an activity scheduled without a heartbeat timeout."""
MAX_HEARTBEAT_THROTTLE_SECONDS = 2.0
"""The worker's `max_heartbeat_throttle_interval`. The SDK otherwise holds a heartbeat back
until 80 % of the heartbeat timeout has passed since the last one it sent, which would leave a
line only 20 % of its timeout of slack; with this, each heartbeat here goes out when made."""


def heartbeat_period() -> float:
    """Seconds between this activity's heartbeats (half its heartbeat timeout)."""
    timeout = activity.info().heartbeat_timeout
    if timeout is None:
        return HEARTBEAT_EVERY
    return timeout.total_seconds() * HEARTBEAT_SHARE


class heartbeating:  # noqa: N801 - used like the context manager function it replaced
    """`async with heartbeating():` heartbeats every half heartbeat timeout while the body
    waits.

    Not at once: a heartbeat per short line would be a server write per line. A timer on the
    event loop, not a task: a line that is answered before its first heartbeat (most lines)
    costs one timer set and cancelled."""

    __slots__ = ("_ctx", "_handle", "_loop", "_period")

    async def __aenter__(self) -> None:
        self._period = heartbeat_period()
        self._loop = asyncio.get_running_loop()
        self._ctx = contextvars.copy_context()  # the activity's: `activity.heartbeat` needs it
        self._handle = self._loop.call_later(self._period, self._beat, context=self._ctx)

    def _beat(self) -> None:
        activity.heartbeat()
        self._handle = self._loop.call_later(self._period, self._beat, context=self._ctx)

    async def __aexit__(self, *exc: object) -> None:
        self._handle.cancel()
