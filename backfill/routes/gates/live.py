"""Yield to live traffic: no new batch line while N live requests are in flight on the route,
summed over every api process (each reports its count: decision 0009, `api.live.reporter`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from backfill.routes.gates.base import (
    OPEN,
    FormField,
    Gate,
    GateAnswer,
    GateContext,
    GateEntry,
    GateSignal,
    GateState,
)
from backfill.routes.reasons import WaitReason

LIVE_REPORT_TTL = 30.0
"""Seconds after which an api process's non-zero live count, not renewed, is forgotten (it died)."""
REGISTRATION_TTL = 600.0
"""Seconds an api process that reported 0 stays counted among the reporters (it shares the
slack below the threshold; see `api.live.reporter`)."""


class YieldToLiveTraffic(BaseModel):
    """ "Yield to live traffic": no new batch line while this many live requests are in flight
    on the route, summed over every api process."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    pause_at_in_flight: int = Field(ge=1, le=100_000)
    """No new batch line while this many live requests are in flight on the route."""


class LiveReport(BaseModel):
    """An api process's live requests in flight on the route (`report_live` signal)."""

    process: str
    in_flight: int


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


STATE = GateState(key="live", type=dict[str, LiveCount], initial=dict)
"""Each api process's last reported live count (by process id)."""


def counts(ctx: GateContext) -> Mapping[str, LiveCount]:
    """The live counts as the scheduler recorded them (seat-aware admission reads them too)."""
    return ctx.state_of(STATE)  # type: ignore[no-any-return]


def decide(setting: YieldToLiveTraffic, ctx: GateContext) -> GateAnswer:
    """Closed while the live requests in flight reach the threshold; it may open when a count
    that is not renewed expires."""
    live = counts(ctx)
    if live_in_flight(live, ctx.at) >= setting.pause_at_in_flight:
        return GateAnswer(False, WaitReason.LIVE, wake_at=live_expiry(live, ctx.at))
    return OPEN


def report(live: Mapping[str, LiveCount], r: LiveReport, now: float) -> dict[str, LiveCount]:
    """The counts after an api process reported (sent only when it could change the gate, and
    as a keep-alive while the gate is closed by live traffic): stale ones dropped; 0 keeps the
    process registered."""
    kept = forget_stale(live, now)
    kept[r.process] = LiveCount(in_flight=max(0, r.in_flight), at=now)
    return kept


def _status(live: Mapping[str, LiveCount], gate: Gate, now: float) -> Mapping[str, Any]:
    return {"live_in_flight": live_in_flight(live, now)}


ENTRY = GateEntry(
    name="yield_to_live_traffic",
    label="Yield to live traffic",
    model=YieldToLiveTraffic,
    decide=decide,
    doc='"Yield to live traffic" (null: off).',
    summary=lambda s: f"pause at {s.pause_at_in_flight} in flight",
    form=(FormField("pause_at_in_flight", "Pause at live requests in flight (blank: off)"),),
    state=STATE,
    signals=(GateSignal("report_live", LiveReport, report),),
    status=_status,
)
