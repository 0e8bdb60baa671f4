"""Tells each route's scheduler how many seats this worker holds back from its batch lines.

Preemptive yield's live-latency target makes the workers hold seats back (docs/decisions/0025).
A line the scheduler allots into those seats can only wait at a worker's door, so the worker
signals the scheduler (`report_held_back`) at every change and renews a non-zero count every
`HELD_BACK_RENEW` seconds (the scheduler forgets one not renewed in `HELD_BACK_TTL`: a dead
worker stops holding seats). The board calls `changed` on the worker's event loop; signals go
out from a task of their own, so a slow Temporal never holds the board up.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid

from temporalio.client import Client

from backfill.platform import refs
from backfill.platform.background import Background, woken
from backfill.platform.ids import scheduler_workflow_id
from backfill.routes.gates.seats import HELD_BACK_RENEW, HeldBackReport

log = logging.getLogger(__name__)


def worker_id() -> str:
    """This worker process, unique across restarts (host, pid, a random suffix)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class HeldBackReporter:
    def __init__(self, client: Client, worker: str | None = None) -> None:
        self._client = client
        self.worker = worker or worker_id()
        self._seats: dict[str, int] = {}
        self._dirty: set[str] = set()
        self._wake = asyncio.Event()
        self._background = Background()

    def changed(self, route: str, seats: int) -> None:
        """The board's seats held back from `route` are now `seats` (on the event loop)."""
        self._seats[route] = seats
        self._dirty.add(route)
        self._wake.set()

    def start(self) -> HeldBackReporter:
        self._background.start(self._run())
        return self

    async def stop(self) -> None:
        await self._background.stop()

    async def _run(self) -> None:
        renewed = time.monotonic()
        while True:
            await woken(self._wake, HELD_BACK_RENEW)
            due, self._dirty = self._dirty, set()
            if time.monotonic() - renewed >= HELD_BACK_RENEW:
                due |= {r for r, n in self._seats.items() if n > 0}
                renewed = time.monotonic()
            await asyncio.gather(*(self._signal(r, self._seats[r]) for r in sorted(due)))

    async def _signal(self, route: str, seats: int) -> None:
        handle = self._client.get_workflow_handle_for(
            refs.RouteSchedulerWorkflow.run, scheduler_workflow_id(route)
        )
        try:
            await handle.signal(
                refs.RouteSchedulerWorkflow.report_held_back,
                HeldBackReport(worker=self.worker, seats=seats),
            )
        except Exception as err:  # Temporal down, no scheduler: the next change or renewal
            log.info("seats held back on %s not reported: %s", route, err)
