"""Reports this api process's live requests in flight to each route's scheduler, only when the
report can matter to "Yield to live traffic" (docs/decisions/0009).

For each route the reporter reads the scheduler's view (`live_gate` query: the threshold and the
count it holds for each api process; queries cost no history) through the process's one
`api.routes.poller.RoutePoller`, at most `VIEW_TTL` seconds old and only while this process has
live requests on the route or a count held there. It signals `report_live` by the rule of
`should_report`:
- below the threshold every registered process has an equal share of the slack, so however
  counts move inside their shares the true sum stays below the threshold and nothing is sent;
  a process that outgrows its share reports (the sum may be crossing);
- at or above it, a process reports when its own drop would reopen the gate, and renews a
  non-zero count every `KEEPALIVE_SECONDS` so that a process that dies is forgotten within 30 s.
A token bucket per route bounds one process's signals. Temporal being down never affects live
traffic: a failed query or signal is logged and tried again on the next change or tick.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass, field

from api.live.traffic import LiveTraffic
from api.routes.poller import RoutePoller
from api.temporal_link import TemporalLink
from backfill.platform import refs
from backfill.platform.background import Background, woken
from backfill.platform.ids import scheduler_workflow_id
from backfill.platform.messages import LiveGateView
from backfill.routes.gates.live import LiveReport

log = logging.getLogger(__name__)

TICK_SECONDS = 0.5
"""How often each route is reconsidered without a change (keep-alives, a fresher view)."""
VIEW_TTL = 0.5
"""Seconds a scheduler's view is reused while its gate is on."""
OFF_VIEW_TTL = 5.0
"""... and while it is off (or there is no scheduler): how soon turning it on is noticed."""
KEEPALIVE_SECONDS = 10.0
BUCKET_SIZE = 3.0
BUCKET_REFILL_PER_SECOND = 0.4
"""Per route and process: at most 3 signals at once, then one every 2.5 s. A crossing and its
release cost two, so isolated crossings (one every 5 s or more) are reported at once, and a sum
flapping around the threshold costs the scheduler under 10 history events a second with two
api processes (each signal ≈ 4 events, plus the allotment signals and acks of a gate change)."""


def process_id() -> str:
    """This api process, unique across hosts and restarts."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def should_report(
    *,
    current: int,
    held: int | None,
    others: int,
    processes: int,
    threshold: int | None,
    since_sent: float,
    every_change: bool = False,
) -> bool:
    """Whether to send `current` now. Pure.

    `held` is this process's count as the scheduler holds it (None: not registered there),
    `others` the other processes' held counts summed, `processes` how many it holds (this one
    included once registered). Below the threshold each registered process may run up to its
    held count plus an equal share of the slack, `(threshold - 1 - sum) // processes`, without
    saying anything: however the counts move within those bounds the true sum stays below the
    threshold, so the gate is right to be open. Past its bound a process reports (the sum may
    now cross). At or above the threshold a process reports when its own drop would reopen the
    gate, and renews its count every `KEEPALIVE_SECONDS` so that a dead process is forgotten."""
    if threshold is None:
        if every_change:  # seat-aware admission: its allotment follows every change
            return current != (held or 0) or (current > 0 and since_sent >= KEEPALIVE_SECONDS)
        return False
    if held is None:
        return current > 0  # register: from now on it shares the slack
    total = others + held
    if total >= threshold:  # closed
        if others + current < threshold:
            return True
        return held > 0 and current > 0 and since_sent >= KEEPALIVE_SECONDS
    share = (threshold - 1 - total) // max(1, processes)
    if current > held + share:
        return True
    if held > 0 and current == 0:
        return True  # give the reserved room back
    return held > 0 and since_sent >= KEEPALIVE_SECONDS


@dataclass
class _Route:
    view: LiveGateView | None = None
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
    def __init__(
        self,
        live: LiveTraffic,
        link: TemporalLink,
        routes: list[str],
        poller: RoutePoller | None = None,
    ) -> None:
        self.live = live
        self.link = link
        self.poller = poller or RoutePoller(link)
        self._own_poller = poller is None
        """The routes' schedulers, read once for every loop of the process (`api.app`)."""
        self.me = process_id()
        self._routes = {r: _Route() for r in routes}
        self._wake = asyncio.Event()
        self._background = Background()
        self._unsubscribe = live.subscribe(lambda route, count: self._wake.set())
        self.signals_sent = 0

    def start(self) -> None:
        self._background.start(self._run())

    async def stop(self) -> None:
        self._unsubscribe()
        await self._background.stop()
        if self._own_poller:
            await self.poller.close()

    async def _run(self) -> None:
        while True:
            await woken(self._wake, TICK_SECONDS)
            for route in self._routes:
                try:
                    await self._consider(route)
                except Exception as err:  # Temporal down or slow: live traffic goes on
                    log.debug("live report for %s not sent: %s", route, err)

    async def _consider(self, route: str) -> None:
        state = self._routes[route]
        current = self.live.count(route)
        now = time.monotonic()
        held_now = state.view.counts.get(self.me, 0) if state.view else 0
        if current == 0 and held_now == 0:
            return  # nothing to say and nothing held for us
        gate_off = (
            state.view is not None and state.view.threshold is None and not state.view.every_change
        )
        state.view = await self.poller.live_gate(route, OFF_VIEW_TTL if gate_off else VIEW_TTL)
        counts = state.view.counts
        if not should_report(
            current=current,
            held=counts.get(self.me),
            others=sum(n for p, n in counts.items() if p != self.me),
            processes=len(counts) + (0 if self.me in counts else 1),
            threshold=state.view.threshold,
            since_sent=now - state.sent_at,
            every_change=state.view.every_change,
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
        self.poller.forget(route)  # read what the scheduler holds now before deciding again
