"""Sends this worker's batch lines upstream to every other worker, for exact preemption.

Preemption must count every batch line upstream on a route, whichever worker runs it
(docs/decisions/0035). The board calls `changed(route)` whenever this worker's lines there change (a
line goes upstream, ends, or is told to stop); a task of its own sends the route's lines (each:
seconds since it went upstream, whether it may still be preempted, and when it went upstream in unix
seconds, the rank every worker gives it) to every other worker's channel (`POST /preempt/lines`,
signed with the shared token: `backfill.preemption.signing`), at once and as a keep-alive every
second (a worker forgets another's lines not renewed in 5 s). The other workers are found as the api
processes find them: polling the task queue (`backfill.preemption.peers`). Changes that come while a
round is being sent go out together in the next one.
"""

from __future__ import annotations

import asyncio
import logging
import time

import httpx
from temporalio.client import Client

from activities.preemption.board import PreemptBoard
from backfill.platform.background import Background, woken
from backfill.platform.messages import PeerLinesReport
from backfill.platform.metrics import PREEMPT_PEERS
from backfill.preemption.failures import SendFailures
from backfill.preemption.peers import (
    DEFAULT_PREEMPT_NETWORKS,
    LOOK_EVERY,
    Network,
    find_workers,
    parse_networks,
)
from backfill.preemption.signing import sign
from worker.preemption.channel import LINES_PATH

log = logging.getLogger(__name__)

KEEPALIVE_SECONDS = 1.0
SEND_TIMEOUT = 1.0


class PeerSender:
    def __init__(
        self,
        client: Client,
        board: PreemptBoard,
        *,
        worker: str,
        own_url: str,
        task_queue: str,
        token: str,
        transport: httpx.AsyncBaseTransport | None = None,
        networks: list[Network] | None = None,
    ) -> None:
        self._client = client
        self._board = board
        self.worker = worker
        self._own = own_url
        self._task_queue = task_queue
        self._token = token
        """The key reports are signed with (never sent)."""
        self._networks = networks or parse_networks(DEFAULT_PREEMPT_NETWORKS)
        """Where another worker found on the task queue may be (`BACKFILL_PREEMPT_NETWORKS`)."""
        self._failures = SendFailures("lines", log)
        self._transport = transport
        self.peers: list[str] = []
        self._routes: set[str] = set()
        """Routes this worker has reported lines on (renewed, empty lists too)."""
        self._dirty: set[str] = set()
        self._wake = asyncio.Event()
        self._background = Background()
        self._http: httpx.AsyncClient | None = None

    def changed(self, route: str) -> None:
        """This worker's lines on `route` changed (on the event loop)."""
        self._routes.add(route)
        self._dirty.add(route)
        self._wake.set()

    def start(self) -> PeerSender:
        self._http = httpx.AsyncClient(
            trust_env=False, timeout=SEND_TIMEOUT, transport=self._transport
        )
        self._background.start(self._send_loop(), self._look())
        return self

    async def stop(self) -> None:
        await self._background.stop()
        if self._http is not None:
            await self._http.aclose()

    async def _look(self) -> None:
        while True:
            try:
                found = await find_workers(self._client, self._task_queue, self._networks)
                self.peers = [u for u in found if u != self._own]
                PREEMPT_PEERS.set(len(self.peers))
            except Exception as err:  # Temporal down or slow: keep the peers we had
                log.debug("other workers not looked up: %s", err)
            await asyncio.sleep(LOOK_EVERY)

    async def _send_loop(self) -> None:
        last_keepalive = -1e9
        while True:
            await woken(self._wake, KEEPALIVE_SECONDS)
            now = time.monotonic()
            if now - last_keepalive >= KEEPALIVE_SECONDS:
                due, last_keepalive = set(self._routes), now
            else:
                due = set(self._dirty)
            self._dirty.clear()
            if self.peers and due:
                await asyncio.gather(*(self._send(r) for r in sorted(due)))

    async def _send(self, route: str) -> None:
        assert self._http is not None
        own = self._board.own_lines(route)
        report = PeerLinesReport(
            worker=self.worker,
            route=route,
            lines=[(line.age, line.preemptible) for line in own],
            started_at=[line.started_at for line in own],
        )
        body = report.model_dump_json().encode()
        headers = {**sign(self._token, LINES_PATH, body), "Content-Type": "application/json"}

        async def one(peer: str) -> None:
            assert self._http is not None
            try:
                resp = await self._http.post(peer + LINES_PATH, content=body, headers=headers)
                if resp.status_code != 204:
                    self._failures.failed(peer, "refused", f"HTTP {resp.status_code}")
            except httpx.HTTPError as err:
                self._failures.failed(peer, "unreachable", repr(err))

        await asyncio.gather(*(one(p) for p in self.peers))
