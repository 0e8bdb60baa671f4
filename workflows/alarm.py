"""One durable timer per purpose, re-armed only when its deadline changes.

A workflow loop that passed a timeout to every `wait_condition` would start and cancel a timer
on each wake-up (two history events per line); an Alarm starts one timer per distinct deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from temporalio import workflow


class Alarm:
    def __init__(self, on_ring: Callable[[], None]) -> None:
        self._on_ring = on_ring
        self._at: float | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def at(self) -> float | None:
        return self._at

    def set(self, at: float | None, *, ring_if_past: bool = False) -> None:
        """Ring at `at` (unix seconds, workflow time), or never with None.

        `ring_if_past`: a deadline already reached rings now, in this activation, instead of on
        a one-millisecond timer (which woke the workflow in a new task, and which the
        time-skipping test server could not cancel once it had fired)."""
        if ring_if_past and at is not None and at <= workflow.now().timestamp():
            self.set(None)
            self._on_ring()
            return
        if at == self._at and (at is None or self._task is not None):
            return
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self._at = at
        if at is not None:
            delay = max(0.001, at - workflow.now().timestamp())
            self._task = asyncio.create_task(self._ring(delay))

    async def _ring(self, delay: float) -> None:
        await workflow.sleep(delay)
        self._task = None
        self._at = None
        self._on_ring()
