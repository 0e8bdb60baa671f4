"""A route's gates, pure: may a new batch line start on the route now, and if not, why.

No temporalio import. `RouteSchedulerWorkflow` passes `workflow.now()` and its recorded state in
and acts on the answer: while the gate is closed every allotment drops to zero (running lines
finish), and the scheduler sleeps until `Gate.wake_at` or the next signal.

The reasons are the exact strings the route status and each batch's extension fields show.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel

from backfill.reasons import WaitReason

REASON_WINDOW = WaitReason.WINDOW
REASON_LIVE = WaitReason.LIVE
REASON_BUSY = WaitReason.BUSY
REASON_METRICS = WaitReason.METRICS
REASON_BACKOFF = WaitReason.BACKOFF

LIVE_REPORT_TTL = 30.0
"""Seconds after which an api process's non-zero live count, not renewed, is forgotten (it died)."""
REGISTRATION_TTL = 600.0
"""Seconds an api process that reported 0 stays counted among the reporters (it shares the
slack below the threshold; see `api.live_reporter`)."""
MAX_BACKOFF_SECONDS = 60.0
BACKOFF_RESET_SECONDS = 10.0
"""A rate-limit answer this long after the last pause ended starts the back-off over at 1 s:
lines ran again without being refused, so the upstream had recovered."""


class LiveCount(BaseModel):
    """The live requests one api process has in flight on the route, as it last reported."""

    in_flight: int
    at: float
    """When the scheduler recorded it (unix seconds, workflow time)."""


class Backoff(BaseModel):
    """The route's rate-limit back-off."""

    until: float | None = None
    """No new line starts before this (unix seconds); None: not backing off."""
    level: int = 0
    """Consecutive rate-limit answers (the delay doubles with each)."""
    last_at: float | None = None
    """When the last rate-limit answer was recorded."""


@dataclass(frozen=True)
class Gate:
    open: bool
    reason: str | None = None
    """Why it is closed (one of the REASON_ strings)."""
    detail: str | None = None
    """More for an operator (e.g. the metrics error)."""
    wake_at: float | None = None
    """When the answer may change with time alone (a back-off ending, a live count expiring)."""


def _current(c: LiveCount, now: float) -> bool:
    ttl = LIVE_REPORT_TTL if c.in_flight > 0 else REGISTRATION_TTL
    return now - c.at < ttl


def live_in_flight(counts: dict[str, LiveCount], now: float) -> int:
    """Live requests in flight on the route, summed over every api process still reporting."""
    return sum(c.in_flight for c in counts.values() if c.in_flight > 0 and _current(c, now))


def forget_stale(counts: dict[str, LiveCount], now: float) -> dict[str, LiveCount]:
    """The processes still reporting: a non-zero count not renewed within `LIVE_REPORT_TTL`,
    and a zero one within `REGISTRATION_TTL`, is dropped."""
    return {p: c for p, c in counts.items() if _current(c, now)}


def live_expiry(counts: dict[str, LiveCount], now: float) -> float | None:
    """When the earliest non-zero live count would be forgotten (None: none would)."""
    times = [c.at + LIVE_REPORT_TTL for c in counts.values() if c.in_flight > 0]
    future = [t for t in times if t > now]
    return min(future) if future else None


MAX_RETRY_AFTER_SECONDS = 3600.0
"""The longest Retry-After honoured (a longer one is read as this)."""


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


def route_gate(
    *,
    now: float,
    window_open: bool = True,
    window_changes_at: float | None = None,
    backoff: Backoff | None = None,
    live_threshold: int | None = None,
    live: dict[str, LiveCount] | None = None,
    load_state: str | None = None,
    load_error: str | None = None,
) -> Gate:
    """Whether a new line may start on the route at `now`, checking every gate.

    - `window_open` / `window_changes_at`: the time window's answer (`backfill.windows`).
    - `backoff`: the route's rate-limit back-off.
    - `live_threshold`: "Yield to live traffic" (None: off); `live`: each api process's count.
    - `load_state`: the server-load signal's last verdict, "open", "busy" or "unavailable"
      (None: the signal is off).
    The first closed gate, in that order, names the reason."""
    if not window_open:
        return Gate(False, REASON_WINDOW, wake_at=window_changes_at)
    if backoff is not None and backoff.until is not None and now < backoff.until:
        return Gate(False, REASON_BACKOFF, wake_at=_earliest(backoff.until, window_changes_at))
    if live_threshold is not None:
        counts = live or {}
        if live_in_flight(counts, now) >= live_threshold:
            wake = _earliest(live_expiry(counts, now), window_changes_at)
            return Gate(False, REASON_LIVE, wake_at=wake)
    if load_state == "unavailable":
        return Gate(False, REASON_METRICS, detail=load_error, wake_at=window_changes_at)
    if load_state == "busy":
        return Gate(False, REASON_BUSY, detail=load_error, wake_at=window_changes_at)
    return Gate(True, wake_at=window_changes_at)


def _earliest(*times: float | None) -> float | None:
    known = [t for t in times if t is not None]
    return min(known) if known else None
