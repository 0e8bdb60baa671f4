"""Sends this api process's live counts straight to the workers, for preemptive yield.

A route whose `preempt` setting is on needs its batch lines ended within tens of milliseconds of a
live arrival; a Temporal signal through the route scheduler and the batch to the line activity takes
hundreds of milliseconds or more (docs/decisions/0023). So each api process POSTs the route's live
count to every worker's HTTP server (`BACKFILL_PREEMPT_WORKER_URLS` and those found on the task
queue inside `BACKFILL_PREEMPT_NETWORKS`; each report signed with `BACKFILL_PREEMPT_TOKEN`, which is
never sent: `backfill.preemption.signing`) at every change, and once a second as a keep-alive (a
worker forgets a count not renewed in 5 s). Which routes have it on comes from the scheduler's
`live_gate` query (no history, through the process's one `api.routes.poller.RoutePoller`), re-read
every `POLICY_TTL` seconds by a task of its own, so a live arrival's report never waits behind a
Temporal query. Only counts are sent: each worker reads the route's policy from the scheduler
itself. Temporal or a worker being down never affects live traffic: failures are counted and logged
at warning (`backfill.preemption.failures`), and the next change or tick tries again.
"""

from __future__ import annotations

import asyncio
import logging
import time

import httpx

from api.live.traffic import LiveTraffic
from api.routes.poller import RoutePoller
from api.temporal_link import TemporalLink
from backfill.platform.background import Background, woken
from backfill.platform.messages import LiveCountReport
from backfill.platform.metrics import PREEMPT_WORKERS
from backfill.preemption.failures import SendFailures
from backfill.preemption.peers import (
    DEFAULT_PREEMPT_NETWORKS,
    Network,
    find_workers,
    parse_networks,
)
from backfill.preemption.policy import POLICY_TTL
from backfill.preemption.signing import sign
from backfill.routes.gates.preempt import PreemptPolicy

log = logging.getLogger(__name__)

KEEPALIVE_SECONDS = 1.0
PATH = "/preempt/live"
SEND_TIMEOUT = 1.0


class PreemptSender:
    def __init__(
        self,
        live: LiveTraffic,
        link: TemporalLink,
        routes: list[str],
        worker_urls: list[str],
        token: str,
        process: str,
        transport: httpx.AsyncBaseTransport | None = None,
        task_queue: str | None = None,
        poller: RoutePoller | None = None,
        networks: list[Network] | None = None,
    ) -> None:
        self.live = live
        self.link = link
        self.poller = poller or RoutePoller(link)
        self._own_poller = poller is None
        """The routes' schedulers, read once for every loop of the process (`api.app`)."""
        self.routes = routes
        self._listed = [u.rstrip("/") for u in worker_urls]
        """`BACKFILL_PREEMPT_WORKER_URLS`: workers always sent to, besides those found."""
        self._task_queue = task_queue
        """Where the workers are found (`backfill.preemption.peers`; None: the list only)."""
        self.workers = list(self._listed)
        """Every worker's channel address: listed and found."""
        self.reached: set[str] = set()
        """The workers whose last report was taken (204)."""
        self.process = process
        self._transport = transport
        self._token = token
        """The key reports are signed with (never sent)."""
        self._networks = networks or parse_networks(DEFAULT_PREEMPT_NETWORKS)
        """Where a worker found on the task queue may be (`BACKFILL_PREEMPT_NETWORKS`)."""
        self._failures = SendFailures("live", log)
        self._policies: dict[str, PreemptPolicy | None] = {}
        self._dirty: set[str] = set()
        self._wake = asyncio.Event()
        self._background = Background()
        self._http: httpx.AsyncClient | None = None
        self._posting: dict[str, asyncio.Task[None]] = {}
        """Each worker's report being sent (one at a time per worker, so they arrive in order)."""
        self._behind: dict[str, set[str]] = {}
        """Routes to send a worker again once its current report ends."""
        self._unsubscribe = live.subscribe(self._changed)
        self.sent = 0

    def _changed(self, route: str, count: int) -> None:
        if self._policies.get(route) is not None:
            self._dirty.add(route)
            self._wake.set()

    def start(self) -> None:
        self._http = httpx.AsyncClient(
            trust_env=False, timeout=SEND_TIMEOUT, transport=self._transport
        )
        self._background.start(self._run(), self._refresh())

    async def stop(self) -> None:
        self._unsubscribe()
        await self._background.stop(*self._posting.values())
        if self._own_poller:
            await self.poller.close()
        if self._http is not None:
            await self._http.aclose()

    async def _run(self) -> None:
        last_keepalive = -1e9
        while True:
            await woken(self._wake, KEEPALIVE_SECONDS)
            now = time.monotonic()
            on = [r for r in self.routes if self._policies.get(r) is not None]
            if now - last_keepalive >= KEEPALIVE_SECONDS:
                due, last_keepalive = set(on), now
            else:
                due = self._dirty & set(on)
            self._dirty.clear()
            for route in sorted(due):
                await self._send(route)

    async def _send(self, route: str) -> None:
        """The route's count to every worker, without waiting for any: a worker still busy with
        an earlier report (slow, or gone and timing out) gets the route's latest count when that
        one ends, so one worker never holds the others' reports back."""
        for worker in self.workers:
            task = self._posting.get(worker)
            if task is not None and not task.done():
                self._behind.setdefault(worker, set()).add(route)
            else:
                self._posting[worker] = asyncio.create_task(self._post(worker, {route}))
        self.sent += 1
        PREEMPT_WORKERS.labels("found").set(len(self.workers))
        PREEMPT_WORKERS.labels("reached").set(len(self.reached & set(self.workers)))

    async def _post(self, worker: str, routes: set[str]) -> None:
        """Each route's count, as it is when sent, to one worker; then whatever came meanwhile."""
        while routes:
            for route in sorted(routes):
                assert self._http is not None
                report = LiveCountReport(
                    route=route,
                    process=self.process,
                    live=self.live.count(route),
                    ttft_ms=self.live.recent_ttft_ms(route),
                )
                body = report.model_dump_json().encode()
                headers = {**sign(self._token, PATH, body), "Content-Type": "application/json"}
                try:
                    resp = await self._http.post(worker + PATH, content=body, headers=headers)
                    if resp.status_code != 204:
                        self._failures.failed(worker, "refused", f"HTTP {resp.status_code}")
                        self.reached.discard(worker)
                    else:
                        self.reached.add(worker)
                except httpx.HTTPError as err:
                    self._failures.failed(worker, "unreachable", repr(err))
                    self.reached.discard(worker)
            routes = self._behind.pop(worker, set())

    async def _refresh(self) -> None:
        """Read the routes' policies now and every `POLICY_TTL` seconds; a route that turns
        preemption on is reported at once."""
        while True:
            before = {r for r in self.routes if self._policies.get(r) is not None}
            await self._find_workers()
            await self._read_policies()
            turned_on = {r for r in self.routes if self._policies.get(r) is not None} - before
            if turned_on:
                self._dirty |= turned_on
                self._wake.set()
            await asyncio.sleep(POLICY_TTL)

    async def _find_workers(self) -> None:
        """The listed workers and those polling the task queue now; a new one is sent the
        current counts at once."""
        if self._task_queue is None:
            return
        try:
            found = await find_workers(self.link.client(), self._task_queue, self._networks)
        except Exception as err:  # Temporal down or slow: keep the workers we had
            log.debug("preemption workers not looked up: %s", err)
            return
        workers = sorted(set(self._listed) | set(found))
        if set(workers) - set(self.workers):
            self._dirty |= set(self.routes)
            self._wake.set()
        self.workers = workers

    async def _read_policies(self) -> None:
        for route in self.routes:
            try:
                view = await self.poller.live_gate(route, POLICY_TTL)
                self._policies[route] = view.preempt
            except Exception as err:  # Temporal down or slow: keep what we had
                log.debug("preemption policy of %s not read: %s", route, err)
