"""Sends this api process's live counts straight to the workers, for preemptive yield.

A route whose `preempt` setting is on needs its batch lines ended within tens of milliseconds of a
live arrival; a Temporal signal through the route scheduler and the batch to the line activity
takes hundreds of milliseconds or more (docs/decisions/0023). So each api process POSTs the
route's live count to every worker's HTTP server (`BACKFILL_PREEMPT_WORKER_URLS`, bearer
`BACKFILL_PREEMPT_TOKEN`) at every change, and once a second as a keep-alive (a worker forgets a
count not renewed in 5 s). Which routes have it on comes from the scheduler's `live_gate` query
(no history), re-read every `POLICY_TTL` seconds by a task of its own, so a live arrival's
report never waits behind a Temporal query. Only counts are sent: each worker reads the route's
policy from the scheduler itself. Temporal or a worker being down never
affects live traffic: failures are logged and the next change or tick tries again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import httpx

from api.live_traffic import LiveTraffic
from api.temporal_link import TemporalLink
from backfill.gates.preempt import PreemptPolicy
from backfill.messages import LiveCountReport
from backfill.preempt_policy import POLICY_TTL, read_preempt_policy

log = logging.getLogger(__name__)

KEEPALIVE_SECONDS = 1.0
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
    ) -> None:
        self.live = live
        self.link = link
        self.routes = routes
        self.urls = [u.rstrip("/") + "/preempt/live" for u in worker_urls]
        self.process = process
        self._transport = transport
        self._headers = {"Authorization": f"Bearer {token}"}
        self._policies: dict[str, PreemptPolicy | None] = {}
        self._dirty: set[str] = set()
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._http: httpx.AsyncClient | None = None
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
        self._tasks = [asyncio.create_task(self._run()), asyncio.create_task(self._refresh())]

    async def stop(self) -> None:
        self._unsubscribe()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._http is not None:
            await self._http.aclose()

    async def _run(self) -> None:
        last_keepalive = -1e9
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(KEEPALIVE_SECONDS):
                    await self._wake.wait()
            self._wake.clear()
            now = time.monotonic()
            on = [r for r in self.routes if self._policies.get(r) is not None]
            if now - last_keepalive >= KEEPALIVE_SECONDS:
                due, last_keepalive = set(on), now
            else:
                due = self._dirty & set(on)
            self._dirty.clear()
            await asyncio.gather(*(self._send(r) for r in due))

    async def _send(self, route: str) -> None:
        assert self._http is not None
        report = LiveCountReport(
            route=route,
            process=self.process,
            live=self.live.count(route),
            ttft_ms=self.live.recent_ttft_ms(route),
        )
        body = report.model_dump_json().encode()
        headers = {**self._headers, "Content-Type": "application/json"}

        async def one(url: str) -> None:
            assert self._http is not None
            try:
                resp = await self._http.post(url, content=body, headers=headers)
                if resp.status_code != 204:
                    log.warning("worker %s refused a live count (%d)", url, resp.status_code)
            except httpx.HTTPError as err:
                log.debug("live count not sent to %s: %s", url, err)

        await asyncio.gather(*(one(u) for u in self.urls))
        self.sent += 1

    async def _refresh(self) -> None:
        """Read the routes' policies now and every `POLICY_TTL` seconds; a route that turns
        preemption on is reported at once."""
        while True:
            before = {r for r in self.routes if self._policies.get(r) is not None}
            await self._read_policies()
            turned_on = {r for r in self.routes if self._policies.get(r) is not None} - before
            if turned_on:
                self._dirty |= turned_on
                self._wake.set()
            await asyncio.sleep(POLICY_TTL)

    async def _read_policies(self) -> None:
        for route in self.routes:
            try:
                self._policies[route] = await read_preempt_policy(self.link.client(), route)
            except Exception as err:  # Temporal down or slow: keep what we had
                log.debug("preemption policy of %s not read: %s", route, err)
