"""The rate-limit back-off: after a 429/503 or a refused connection, no new line starts on the
route for a while. Always on (no settings); each refusal is a `rate_limited` signal to the
route's scheduler (from the batch that got it), recorded with `back_off`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from backfill.routes.gates.base import (
    OPEN,
    Gate,
    GateAnswer,
    GateContext,
    GateEntry,
    GateSignal,
    GateState,
)
from backfill.routes.reasons import WaitReason

MAX_BACKOFF_SECONDS = 60.0
BACKOFF_RESET_SECONDS = 10.0
"""A rate-limit answer this long after the last pause ended starts the back-off over at 1 s:
lines ran again without being refused, so the upstream had recovered."""
MAX_RETRY_AFTER_SECONDS = 3600.0
"""The longest Retry-After honoured (a longer one is read as this)."""


class RateLimited(BaseModel):
    """A batch line was answered 429/503 or refused: the whole route backs off
    (`rate_limited` signal)."""

    batch_id: str
    retry_after: float | None = None
    """The upstream's Retry-After, in seconds."""
    consecutive: int | None = None
    """Refusals in a row the batch got on the route since its last success there."""


class Backoff(BaseModel):
    """The route's rate-limit back-off."""

    until: float | None = None
    """No new line starts before this (unix seconds); None: not backing off."""
    level: int = 0
    """Consecutive rate-limit answers (the delay doubles with each)."""
    last_at: float | None = None
    """When the last rate-limit answer was recorded."""


def backoff_delay(level: int, retry_after: float | None) -> float:
    """Seconds to hold back after a refusal: 1 s doubling with `level` to 60 s, or the
    upstream's Retry-After (at most an hour) when that is longer."""
    delay = min(MAX_BACKOFF_SECONDS, 2.0**level)
    if retry_after is not None and retry_after > 0:
        delay = max(delay, min(retry_after, MAX_RETRY_AFTER_SECONDS))
    return delay


def back_off(
    b: Backoff, now: float, retry_after: float | None, consecutive: int | None = None
) -> Backoff:
    """The back-off after a rate-limit answer at `now`: 1 s, doubling to 60 s with each
    refusal in a row, or the upstream's Retry-After when that is longer.

    `consecutive` is how many refusals the reporting batch got on the route since its last
    success (it counts successes; the scheduler does not see them): an upstream that refuses
    now and then pauses the route a second each time, a storm doubles the pause. Without it
    (older batches), an answer `BACKOFF_RESET_SECONDS` after the last pause ended starts over."""
    if consecutive is not None:
        level = max(0, consecutive - 1)
    elif b.until is None or now - b.until >= BACKOFF_RESET_SECONDS:
        level = 0
    else:
        level = b.level
    until = now + backoff_delay(level, retry_after)
    if b.until is not None and b.until > until:
        until = b.until  # an earlier, longer back-off still holds
    return Backoff(until=until, level=level + 1, last_at=now)


STATE = GateState(key="backoff", type=Backoff, initial=Backoff)


def decide(_: object, ctx: GateContext) -> GateAnswer:
    """Closed until the back-off ends."""
    b: Backoff = ctx.state_of(STATE)
    if b.until is not None and ctx.at < b.until:
        return GateAnswer(False, WaitReason.BACKOFF, wake_at=b.until)
    return OPEN


def _rate_limited(b: Backoff, r: RateLimited, now: float) -> Backoff:
    return back_off(b, now, r.retry_after, r.consecutive)


def _status(b: Backoff, gate: Gate, now: float) -> Mapping[str, Any]:
    return {"backoff_until": b.until if not gate.open and b.until else None}


ENTRY: GateEntry[BaseModel] = GateEntry(
    name="backoff",
    label="Rate-limit back-off",
    decide=decide,
    state=STATE,
    signals=(GateSignal("rate_limited", RateLimited, _rate_limited),),
    status=_status,
)
