"""Reports this api process's live requests in flight to each route's scheduler, but only what
can change the scheduler's "Yield to live traffic" decision (docs/decisions/0009).

For each route the reporter keeps the scheduler's view (`live_gate` query: the threshold and
each process's count as the scheduler holds it; queries cost no history), refreshed at most
every `VIEW_TTL` seconds and only while this process has something it might say. It signals
`report_live` when:
- its current count would put the route's sum on the other side of the threshold than the
  count the scheduler holds for it (a crossing), or
- the gate is closed with this process's count part of the sum: a keep-alive every
  `KEEPALIVE_SECONDS`, so a process that dies is forgotten (the scheduler drops counts not
  renewed within 30 s) rather than holding the route closed.
While the sum stays below the threshold nothing is sent, however many requests come and go. A
token bucket per route bounds the signals of one process. Temporal being down never affects
live traffic: a failed query or signal is logged and tried again on the next change or tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass, field

from temporalio.service import RPCError, RPCStatusCode

from api.live_traffic import LiveTraffic
from api.temporal_link import TemporalLink
from backfill.ids import scheduler_workflow_id
from workflows import refs
from workflows.messages import LiveGateView, LiveReport

log = logging.getLogger(__name__)

TICK_SECONDS = 0.5
"""How often each route is reconsidered without a change (keep-alives, a fresher view)."""
VIEW_TTL = 0.5
"""Seconds a scheduler's view is reused while its gate is on."""
OFF_VIEW_TTL = 5.0
"""... and while it is off (or there is no scheduler): how soon turning it on is noticed."""
KEEPALIVE_SECONDS = 10.0
BUCKET_SIZE = 2.0
BUCKET_REFILL_PER_SECOND = 0.5
"""Per route and process: at most 2 signals at once, then one every 2 s."""


def process_id() -> str:
    """This api process, unique across hosts and restarts."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def should_report(
    *, current: int, held: int, others: int, threshold: int | None, since_sent: float
) -> bool:
    """Whether to send `current` when the scheduler holds `held` for this process and `others`
    for the rest. Pure."""
    if threshold is None or (current == 0 and held == 0):
        return False
    closed_as_held = others + held >= threshold
    closed_now = others + current >= threshold
    if closed_now != closed_as_held:
        return True
    return closed_now and current > 0 and since_sent >= KEEPALIVE_SECONDS


@dataclass
class _Route:
    view: LiveGateView | None = None
    view_at: float = -1e9
    sent_at: float = -1e9
    tokens: float = BUCKET_SIZE
    tokens_at: float = field(default_factory=time.monotonic)

    def take_token(self, now: float) -> bool:
        self.tokens = min(
            BUCKET_SIZE, self.tokens + (now - self.tokens_at) * BUCKET_REFILL_PER_SECOND
        )
        self.tokens_at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class LiveReporter:
    def __init__(self, live: LiveTraffic, link: TemporalLink, routes: list[str]) -> None:
        self.live = live
        self.link = link
        self.me = process_id()
        self._routes = {r: _Route() for r in routes}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._unsubscribe = live.subscribe(lambda route, count: self._wake.set())
        self.signals_sent = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        self._unsubscribe()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(TICK_SECONDS):
                    await self._wake.wait()
            self._wake.clear()
            for route in self._routes:
                try:
                    await self._consider(route)
                except Exception as err:  # Temporal down or slow: live traffic goes on
                    log.debug("live report for %s not sent: %s", route, err)

    async def _consider(self, route: str) -> None:
        state = self._routes[route]
        current = self.live.count(route)
        now = time.monotonic()
        held = state.view.counts.get(self.me, 0) if state.view else 0
        if current == 0 and held == 0:
            return  # nothing to say and nothing held for us
        gate_off = state.view is not None and state.view.threshold is None
        if now - state.view_at >= (OFF_VIEW_TTL if gate_off else VIEW_TTL):
            state.view = await self._view(route)
            state.view_at = now
        assert state.view is not None
        held = state.view.counts.get(self.me, 0)
        others = sum(n for p, n in state.view.counts.items() if p != self.me)
        if not should_report(
            current=current,
            held=held,
            others=others,
            threshold=state.view.threshold,
            since_sent=now - state.sent_at,
        ):
            return
        if not state.take_token(now):
            return  # a burst of crossings: the next tick sends the latest count
        handle = self.link.client().get_workflow_handle_for(
            refs.RouteSchedulerWorkflow.run, scheduler_workflow_id(route)
        )
        await handle.signal(
            refs.RouteSchedulerWorkflow.report_live, LiveReport(process=self.me, in_flight=current)
        )
        self.signals_sent += 1
        state.sent_at = now
        state.view_at = -1e9  # read what the scheduler holds now before deciding again

    async def _view(self, route: str) -> LiveGateView:
        handle = self.link.client().get_workflow_handle_for(
            refs.RouteSchedulerWorkflow.run, scheduler_workflow_id(route)
        )
        try:
            return await handle.query(refs.RouteSchedulerWorkflow.live_gate)
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return LiveGateView(threshold=None)  # no scheduler: no batch to hold back
            raise
