"""Yield to live traffic: no new batch line while N live requests are in flight on the route,
summed over every api process (each reports its count: decision 0009, `api.live_reporter`)."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field

from backfill.gates.base import OPEN, FormField, GateAnswer, GateContext, GateEntry
from backfill.reasons import WaitReason

LIVE_REPORT_TTL = 30.0
"""Seconds after which an api process's non-zero live count, not renewed, is forgotten (it died)."""
REGISTRATION_TTL = 600.0
"""Seconds an api process that reported 0 stays counted among the reporters (it shares the
slack below the threshold; see `api.live_reporter`)."""


class YieldToLiveTraffic(BaseModel):
    """ "Yield to live traffic": no new batch line while this many live requests are in flight
    on the route, summed over every api process."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    pause_at_in_flight: int = Field(ge=1, le=100_000)
    """No new batch line while this many live requests are in flight on the route."""


class LiveCount(BaseModel):
    """The live requests one api process has in flight on the route, as it last reported."""

    in_flight: int
    at: float
    """When the scheduler recorded it (unix seconds, workflow time)."""


def _current(c: LiveCount, now: float) -> bool:
    ttl = LIVE_REPORT_TTL if c.in_flight > 0 else REGISTRATION_TTL
    return now - c.at < ttl


def live_in_flight(counts: Mapping[str, LiveCount], now: float) -> int:
    """Live requests in flight on the route, summed over every api process still reporting."""
    return sum(c.in_flight for c in counts.values() if c.in_flight > 0 and _current(c, now))


def forget_stale(counts: Mapping[str, LiveCount], now: float) -> dict[str, LiveCount]:
    """The processes still reporting: a non-zero count not renewed within `LIVE_REPORT_TTL`,
    and a zero one within `REGISTRATION_TTL`, is dropped."""
    return {p: c for p, c in counts.items() if _current(c, now)}


def live_expiry(counts: Mapping[str, LiveCount], now: float) -> float | None:
    """When the earliest non-zero live count would be forgotten (None: none would)."""
    times = [c.at + LIVE_REPORT_TTL for c in counts.values() if c.in_flight > 0]
    future = [t for t in times if t > now]
    return min(future) if future else None


def decide(setting: YieldToLiveTraffic, ctx: GateContext) -> GateAnswer:
    """Closed while the live requests in flight reach the threshold; it may open when a count
    that is not renewed expires."""
    if live_in_flight(ctx.live, ctx.at) >= setting.pause_at_in_flight:
        return GateAnswer(False, WaitReason.LIVE, wake_at=live_expiry(ctx.live, ctx.at))
    return OPEN


ENTRY = GateEntry(
    name="yield_to_live_traffic",
    label="Yield to live traffic",
    model=YieldToLiveTraffic,
    decide=decide,
    doc='"Yield to live traffic" (null: off).',
    summary=lambda s: f"pause at {s.pause_at_in_flight} in flight",
    form=(FormField("pause_at_in_flight", "Pause at live requests in flight (blank: off)"),),
)
