"""The worker's end of preemptive yield's direct channel: `POST /preempt/live` on its HTTP server.

Each api process sends every route's live count here when it changes (and once a second while
the route's preemptive yield is on); the request is authenticated with the shared
`BACKFILL_PREEMPT_TOKEN` (a bearer token, compared in constant time) and handed to the worker's
event loop, where `PreemptBoard` ends the lines live traffic needs the seats of
(docs/decisions/0023). The HTTP server's thread never waits for the loop.
"""

from __future__ import annotations

import asyncio
import hmac

from pydantic import ValidationError

from activities.preemption import PreemptBoard
from backfill.messages import LiveCountReport

PATH = "/preempt/live"
MAX_BODY = 4096


class PreemptChannel:
    def __init__(self, board: PreemptBoard, loop: asyncio.AbstractEventLoop, token: str) -> None:
        self.board = board
        self.loop = loop
        self._token = f"Bearer {token}".encode()

    def handle(self, authorization: str | None, body: bytes) -> int:
        """The HTTP status of one request (called on the server's thread)."""
        if authorization is None or not hmac.compare_digest(authorization.encode(), self._token):
            return 401
        try:
            report = LiveCountReport.model_validate_json(body)
        except ValidationError:
            return 400
        self.loop.call_soon_threadsafe(
            self.board.report,
            report.route,
            report.process,
            report.live,
            report.policy,
            report.ttft_ms,
        )
        return 204
