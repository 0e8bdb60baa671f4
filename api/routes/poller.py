"""The api process's one reader of each route scheduler, shared by its background loops.

Three loops read the same scheduler of a route: the live reporter (`live_gate`: the threshold and
the counts it holds, every 0.5 s while it has something to say), the preemption sender (the same
view's policy, every `POLICY_TTL`) and the console's sampler (`status`, every 5 s). Each asks this
poller, saying how old a reading may be: a reading that young is reused, and asks that come while
a query is on its way wait for that query instead of sending their own (one query in flight per
route and kind). So the reporter's fresh view also serves the sender, and a Temporal that does
not answer costs one hanging query per route, not one per loop.

A scheduler that does not exist (no batch on the route yet) reads as such (`LiveGateView` with no
threshold, status None) and is cached like any reading; any other failure is raised to every
waiter and not cached, so the next ask tries again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from temporalio.service import RPCError, RPCStatusCode

from api.batches.history_view import quick_query
from api.temporal_link import TemporalLink
from backfill.platform import refs
from backfill.platform.ids import scheduler_workflow_id
from backfill.platform.messages import LiveGateView
from backfill.routes.status import SchedulerStatus

T = TypeVar("T")


@dataclass
class _Reading(Generic[T]):
    """One kind of reading of one route: the last value, when it was read, the query on its way."""

    value: T | None = None
    at: float = -1e9
    pending: asyncio.Future[T] | None = None


@dataclass
class _Route:
    live_gate: _Reading[LiveGateView] = field(default_factory=_Reading)
    status: _Reading[SchedulerStatus | None] = field(default_factory=_Reading)


class RoutePoller:
    """Readings of each route's scheduler, reused while young enough, one query at a time."""

    def __init__(self, link: TemporalLink) -> None:
        self.link = link
        self._routes: dict[str, _Route] = {}
        self.queries = 0
        """Queries sent (for tests and the bench)."""
        self._pending: set[asyncio.Future[Any]] = set()

    async def close(self) -> None:
        """Cancel the queries on their way (after the loops that ask have stopped)."""
        for pending in list(self._pending):
            pending.cancel()
        await asyncio.gather(*self._pending, return_exceptions=True)

    async def live_gate(self, route: str, max_age: float) -> LiveGateView:
        """The scheduler's `live_gate` view, at most `max_age` seconds old."""
        reading = self._route(route).live_gate
        return await self._read(reading, max_age, lambda: self._query_live_gate(route))

    async def status(self, route: str, max_age: float) -> SchedulerStatus | None:
        """The scheduler's `status` (as of the query's time), at most `max_age` seconds old;
        None: the route has no scheduler (no batch yet)."""
        reading = self._route(route).status
        return await self._read(reading, max_age, lambda: self._query_status(route))

    def forget(self, route: str) -> None:
        """The next ask of the route's `live_gate` queries again (e.g. after a signal changed
        what the scheduler holds)."""
        self._route(route).live_gate.at = -1e9

    def _route(self, route: str) -> _Route:
        return self._routes.setdefault(route, _Route())

    async def _read(
        self, reading: _Reading[T], max_age: float, query: Callable[[], Awaitable[T]]
    ) -> T:
        now = time.monotonic()
        if reading.pending is None and now - reading.at < max_age:
            return reading.value  # type: ignore[return-value]
        if reading.pending is None:
            reading.pending = asyncio.ensure_future(self._fetch(reading, query))
            reading.pending.add_done_callback(_retrieved)
            self._pending.add(reading.pending)
            reading.pending.add_done_callback(self._pending.discard)
        # Shielded: an asker cancelled (its loop stopping) leaves the query to the others.
        return await asyncio.shield(reading.pending)

    async def _fetch(self, reading: _Reading[T], query: Callable[[], Awaitable[T]]) -> T:
        started = time.monotonic()
        try:
            self.queries += 1
            value = await query()
            reading.value, reading.at = value, started
            return value
        finally:
            reading.pending = None

    def _handle(self, route: str) -> Any:
        return self.link.client().get_workflow_handle_for(
            refs.RouteSchedulerWorkflow.run, scheduler_workflow_id(route)
        )

    async def _query_live_gate(self, route: str) -> LiveGateView:
        try:
            return await self._handle(route).query(refs.RouteSchedulerWorkflow.live_gate)
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return LiveGateView(threshold=None)  # no scheduler: no batch to hold back
            raise

    async def _query_status(self, route: str) -> SchedulerStatus | None:
        try:
            return await quick_query(
                self._handle(route), refs.RouteSchedulerWorkflow.status, time.time()
            )
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return None
            raise


def _retrieved(done: asyncio.Future[Any]) -> None:
    """Marks a query's failure as seen when every asker has gone (no "never retrieved")."""
    if not done.cancelled():
        done.exception()
