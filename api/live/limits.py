"""Each workspace's share of the live proxy: at most `max_live_in_flight` requests at once.

All workspaces' live requests share one upstream connection pool (`api.app.UPSTREAM_LIMITS`),
and a streamed answer holds its connection until its last token: without a per-workspace cap,
one workspace's slow streams could take every connection and leave the others `gateway_busy`.
A request takes its workspace's slot as soon as its key is known (before its body is read, so a
slow upload counts too) and gives it back when its answer ends, however it ends (last byte sent,
client gone, upstream failure, error before the upstream call). One over the cap answers 429
`rate_limit_error` `live_limit_exceeded` at once, and nothing goes upstream.

The count is per api process: with several api processes behind a load balancer, a workspace
may have up to the cap in flight on each (the pool they protect is per process too).
"""

from __future__ import annotations

from fastapi import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from api.errors import TooManyRequests


class LiveLimits:
    """In-flight live requests per workspace in this api process. One per app."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}

    def count(self, workspace: str) -> int:
        return self._counts.get(workspace, 0)

    def take(self, workspace: str, cap: int | None) -> LiveSlot:
        """One slot of `workspace`'s `cap` (None: no cap), or 429 when all are taken.

        Checked and counted with no `await` in between, so concurrent requests on the event
        loop can never both take the last slot."""
        count = self._counts.get(workspace, 0)
        if cap is not None and count >= cap:
            raise TooManyRequests(
                f"Your workspace has {count} live requests in flight; its limit is {cap}. "
                "Wait for one to end before sending another.",
                code="live_limit_exceeded",
            )
        self._counts[workspace] = count + 1
        return LiveSlot(self, workspace)

    def _give_back(self, workspace: str) -> None:
        count = self._counts.get(workspace, 0) - 1
        if count > 0:
            self._counts[workspace] = count
        else:
            self._counts.pop(workspace, None)


class LiveSlot:
    """One taken slot; `release` gives it back (once, whatever calls it again)."""

    def __init__(self, limits: LiveLimits, workspace: str) -> None:
        self._limits, self._workspace, self._held = limits, workspace, True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._limits._give_back(self._workspace)

    def until_sent(self, response: Response) -> Response:
        """`response`, holding this slot until it has been sent (or its sending failed)."""
        return _Holding(response, self)


class _Holding(Response):
    def __init__(self, inner: Response, slot: LiveSlot) -> None:
        # No super().__init__(): this only wraps `inner`, which has the status and headers.
        self.inner, self.slot = inner, slot
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.inner(scope, receive, send)
        finally:
            self.slot.release()


def take_live_slot(request: Request, workspace: str) -> LiveSlot:
    """The workspace's slot in this app's `LiveLimits` (429 when its cap is reached)."""
    settings = request.app.state.settings
    limits: LiveLimits = request.app.state.live_limits
    return limits.take(workspace, settings.workspace_limits(workspace).max_live_in_flight)
