"""One durable timer per purpose, re-armed only when its deadline changes.

A workflow loop that passed a timeout to every `wait_condition` would start and cancel a timer
on each wake-up (two history events per line); an Alarm starts one timer per distinct deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from temporalio import workflow

from workflows.patches import ALARM_KEEPS_DUE_TIMERS

DUE_SOON_S = 5.0
"""A timer due this soon may fire while the workflow task that would cancel it is with the
worker. Temporal's time-skipping test server refuses such a task ("invalid history builder
state for action", temporalio/sdk-java#3088) and strands the run; the real server accepts it.
Leaving the timer to fire costs a timer-fired event and a workflow task, seldom."""


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
            due_soon = self._at is not None and self._at <= workflow.now().timestamp() + DUE_SOON_S
            if not (due_soon and workflow.patched(ALARM_KEEPS_DUE_TIMERS)):
                self._task.cancel()
            self._task = None  # a timer left to fire rings for nothing (`_ring`)
        self._at = at
        if at is not None:
            delay = max(0.001, at - workflow.now().timestamp())
            self._task = asyncio.create_task(self._ring(delay))

    async def _ring(self, delay: float) -> None:
        await workflow.sleep(delay)
        if self._task is not asyncio.current_task():
            return  # replaced by a later deadline and left to fire (ALARM_KEEPS_DUE_TIMERS)
        self._task = None
        self._at = None
        self._on_ring()
