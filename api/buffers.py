"""Answers the api builds whole in memory (a results page, a job's output) or streams (a file's
content, a chunk at a time), held against the process's buffer budget
(`Settings.api_buffer_bytes`, the one request bodies draw on; a share per workspace:
`backfill.tenancy.byte_budget`) from before they are built until their last byte is sent.

One that does not fit is answered 503 `gateway_busy` with `Retry-After`, as a body that does not
fit is (`api.middleware.BodyLimit`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from api.errors import RetryLater
from api.middleware import BUSY_RETRY_AFTER
from backfill.tenancy.byte_budget import ByteBudget, Claim


def busy() -> RetryLater:
    return RetryLater(
        "The gateway holds as many answers as it can just now; retry shortly.",
        retry_after=int(BUSY_RETRY_AFTER),
        code="gateway_busy",
    )


def take(budget: ByteBudget, workspace: str, size: int) -> Claim:
    """A claim of `size` bytes in `workspace`'s share, or 503 `gateway_busy`."""
    claim = budget.claim(workspace)
    if not claim.resize(size):
        raise busy()
    return claim


class _Held:
    """Gives `claim` back once the response is sent (or the client is gone)."""

    claim: Claim

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)  # type: ignore[misc]
        finally:
            self.claim.release()


class HeldStreamingResponse(_Held, StreamingResponse):
    """A streamed response (a file's content) whose chunks in flight `claim` holds."""

    def __init__(
        self,
        content: Iterator[bytes],
        claim: Claim,
        media_type: str,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(content, media_type=media_type, headers=headers)
        self.claim = claim


class HeldResponse(_Held, Response):
    """A response whose body `claim` holds."""

    def __init__(
        self,
        content: bytes,
        claim: Claim,
        media_type: str = "application/json",
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(content, media_type=media_type, headers=headers)
        self.claim = claim
