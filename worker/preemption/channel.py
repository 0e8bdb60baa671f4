"""The worker's end of preemptive yield's direct channel: `POST /preempt/live` on its HTTP server.

Each api process sends every route's live count here when it changes (and once a second while
the route's preemptive yield is on); every report is signed with the shared
`BACKFILL_PREEMPT_TOKEN` (HMAC-SHA256 of the path, a timestamp and the body:
`backfill.preemption.signing`; the token never travels), taken only within 30 s of its timestamp
and later than the sender's last one, and handed to the worker's event loop, where
`PreemptBoard` ends the lines live traffic needs the seats of (docs/decisions/0023, 0046). The
HTTP server's thread never waits for the loop.

A report carries counts only, for a configured route only: what each route's seats and bounds
are, the worker reads from the route's scheduler itself (`PolicyReader`), so whoever reaches the
channel can neither widen nor narrow a route, nor grow the board with made-up routes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from pydantic import ValidationError
from temporalio.client import Client

from activities.preemption.board import PreemptBoard
from backfill.platform.background import Background
from backfill.platform.messages import LiveCountReport, PeerLinesReport
from backfill.preemption.policy import POLICY_TTL, read_preempt_policy
from backfill.preemption.signing import ReplayGuard, verified_at

log = logging.getLogger(__name__)

PATH = "/preempt/live"
LINES_PATH = "/preempt/lines"
MAX_BODY = {PATH: 4096, LINES_PATH: 128 * 1024}
"""Largest request body per path (a lines report holds up to 4,096 lines)."""


class PreemptChannel:
    def __init__(
        self,
        board: PreemptBoard,
        loop: asyncio.AbstractEventLoop,
        token: str,
        routes: Iterable[str],
        worker: str = "",
    ) -> None:
        self.board = board
        self.worker = worker
        """This worker's id in the lines reports it sends (its own are ignored)."""
        self.loop = loop
        self._token = token
        self._replays = ReplayGuard()
        self.routes = frozenset(routes)
        """The configured routes: a report on any other is refused."""

    def handle(
        self,
        timestamp: str | None,
        signature: str | None,
        body: bytes,
        path: str = PATH,
        now: float | None = None,
    ) -> int:
        """The HTTP status of one request to `path` (called on the server's thread): 401 for a
        signature that is not the token's or a timestamp outside the window, 409 for a report no
        later than the sender's last (a replay), 400 for a malformed one."""
        at = verified_at(self._token, path, body, timestamp, signature, now)
        if at is None:
            return 401
        try:
            if path == LINES_PATH:
                lines = PeerLinesReport.model_validate_json(body)
                if lines.route not in self.routes:
                    return 400
                if lines.worker == self.worker:  # its own report, sent to itself: not a peer
                    return 204
                if not self._replays.take((path, lines.route, lines.worker), at, now):
                    return 409
                self.loop.call_soon_threadsafe(
                    self.board.peer_lines,
                    lines.route,
                    lines.worker,
                    lines.lines,
                    lines.started_at,
                )
                return 204
            report = LiveCountReport.model_validate_json(body)
        except ValidationError:
            return 400
        if report.route not in self.routes:
            return 400
        if not self._replays.take((path, report.route, report.process), at, now):
            return 409
        self.loop.call_soon_threadsafe(
            self.board.report, report.route, report.process, report.live, report.ttft_ms
        )
        return 204


class PolicyReader:
    """Keeps the board's policy of every configured route as its scheduler holds it: read now
    and every `POLICY_TTL` seconds (a query: no history). Temporal down or slow: the board keeps
    what it had."""

    def __init__(self, client: Client, board: PreemptBoard, routes: Iterable[str]) -> None:
        self._client = client
        self._board = board
        self._routes = sorted(set(routes))
        self._background = Background()

    def start(self) -> PolicyReader:
        self._background.start(self._run())
        return self

    async def stop(self) -> None:
        await self._background.stop()

    async def read(self) -> None:
        for route in self._routes:
            try:
                self._board.set_policy(route, await read_preempt_policy(self._client, route))
            except Exception as err:
                log.debug("preemption policy of %s not read: %s", route, err)

    async def _run(self) -> None:
        while True:
            await self.read()
            await asyncio.sleep(POLICY_TTL)
