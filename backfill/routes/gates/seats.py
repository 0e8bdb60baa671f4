"""Seat-aware admission: batch lines take only the server's seats that live traffic leaves.

The server runs at most `seats` requests at once (vLLM's `--max-num-seqs` × engines). The batch
allotment at any instant is `seats − keep_free − live in flight − other running requests`,
clamped to [0, "Batch lines at once"]: the live count is the gateway's own (as "Yield to live
traffic" counts it); the other running requests are the server-load reading's running count
minus the batch lines the route runs, while a fresh reading is there (the server-load signal on),
else none. No seat left: closed, "Keeping seats free for live traffic".

With preemptive yield's live-latency target the workers hold more seats back from batch lines
(docs/decisions/0025); they report how many (`HeldBackCount`, the highest fresh report counts),
so the allotment stops sending lines that could only wait at a worker's door.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field, model_validator

from backfill.routes.gates import live, server_load
from backfill.routes.gates.base import (
    FormField,
    GateAnswer,
    GateContext,
    GateEntry,
    GateSignal,
    GateState,
)
from backfill.routes.gates.live import live_expiry, live_in_flight
from backfill.routes.reasons import WaitReason

MAX_SEATS = 100_000
READING_FRESH_SECONDS = 15.0
"""A server-load reading older than this is not counted (the watcher reads every 5 s but
signals only when its verdict changes)."""
HELD_BACK_TTL = 30.0
"""Seconds a worker's non-zero held-back report counts without being renewed (workers renew it
every `HELD_BACK_RENEW`): a worker that died stops holding seats back."""
HELD_BACK_RENEW = 10.0
"""Seconds between a worker's renewals of a non-zero held-back report."""


class SeatAware(BaseModel):
    """The settings document's `seat_aware`."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    seats: int = Field(ge=1, le=MAX_SEATS)
    """Requests the server runs at once (vLLM: `--max-num-seqs` × engines)."""
    keep_free: int = Field(default=0, ge=0, le=MAX_SEATS - 1)
    """Seats kept free for live traffic (0 to seats − 1)."""

    @model_validator(mode="after")
    def _fewer_than_seats(self) -> SeatAware:
        if self.keep_free >= self.seats:
            raise ValueError(f"keep_free must be less than seats ({self.seats})")
        return self


class HeldBackReport(BaseModel):
    """A worker's seats held back from the route's batch lines for its live-latency target
    (`report_held_back` signal: at every change, and renewed while not 0)."""

    worker: str
    seats: int


class HeldBackCount(BaseModel):
    """Seats one worker holds back from the route's batch lines, as the scheduler recorded it."""

    seats: int
    at: float
    """When the scheduler recorded it (unix seconds, workflow time)."""


def held_back_seats(counts: Mapping[str, HeldBackCount], now: float) -> int:
    """Seats held back from batch lines now: the highest fresh report (every worker follows
    the same live TTFT, so each holds back about as many; the most cautious one counts)."""
    return max((c.seats for c in counts.values() if now - c.at < HELD_BACK_TTL), default=0)


def keep_held_back(
    counts: Mapping[str, HeldBackCount], now: float, worker: str, seats: int
) -> dict[str, HeldBackCount]:
    """The reports after `worker` reported `seats` at `now`: stale ones and zeros dropped."""
    kept = {w: c for w, c in counts.items() if w != worker and now - c.at < HELD_BACK_TTL}
    if seats > 0:
        kept[worker] = HeldBackCount(seats=seats, at=now)
    return kept


def held_back_expiry(counts: Mapping[str, HeldBackCount], now: float) -> float | None:
    """When the earliest non-zero held-back report would be forgotten (None: none would)."""
    times = [c.at + HELD_BACK_TTL for c in counts.values() if c.seats > 0]
    future = [t for t in times if t > now]
    return min(future) if future else None


STATE = GateState(key="held_back", type=dict[str, HeldBackCount], initial=dict)
"""Seats each worker holds back from batch lines for the live-latency target (by worker), as
it last reported them. They count in decisions only from the patch `seats-held-back` on."""


def _report(
    counts: Mapping[str, HeldBackCount], r: HeldBackReport, now: float
) -> dict[str, HeldBackCount]:
    return keep_held_back(counts, now, r.worker, r.seats)


def others_running(ctx: GateContext) -> tuple[int, float | None]:
    """Requests the server reports running besides the route's batch lines (0 without a fresh
    reading), and when that reading stops being fresh."""
    load = server_load.verdict(ctx)
    reading = load.reading if load is not None else None
    if reading is None or reading.running is None:
        return 0, None
    stale_at = reading.read_at + READING_FRESH_SECONDS
    if ctx.at >= stale_at:
        return 0, None
    return max(0, int(reading.running) - ctx.batch_lines), stale_at


def decide(setting: SeatAware, ctx: GateContext) -> GateAnswer:
    """The batch lines the free seats allow (a limit), or closed when none is free."""
    counts = live.counts(ctx)
    held_back: Mapping[str, HeldBackCount] = ctx.state_of(STATE)
    in_flight = live_in_flight(counts, ctx.at)
    others, stale_at = others_running(ctx)
    held = held_back_seats(held_back, ctx.at)
    free = setting.seats - setting.keep_free - held - in_flight - others
    allowed = max(0, min(free, ctx.cap))
    expiries = (live_expiry(counts, ctx.at), stale_at, held_back_expiry(held_back, ctx.at))
    wakes = [t for t in expiries if t is not None]
    wake = min(wakes) if wakes else None
    if allowed == 0:
        detail = (
            f"{setting.seats} seats: {setting.keep_free} kept free, {in_flight} live, "
            f"{others} other"
        )
        if held:
            detail += f", {held} held back for the live TTFT target"
        return GateAnswer(False, WaitReason.SEATS, detail=detail, wake_at=wake)
    return GateAnswer(True, wake_at=wake, limit=allowed)


ENTRY = GateEntry(
    name="seat_aware",
    label="Seat-aware admission",
    model=SeatAware,
    decide=decide,
    doc='"Seat-aware admission": batch lines take only the seats live traffic leaves, keeping '
    "`keep_free` of the server's `seats` free (null: off).",
    summary=lambda s: f"{s.seats} seats, {s.keep_free} kept free",
    form=(
        FormField("seats", "Server seats (blank: off)"),
        FormField("keep_free", "Seats kept free for live traffic"),
    ),
    state=STATE,
    signals=(GateSignal("report_held_back", HeldBackReport, _report),),
    patch="seats-held-back",
    joins=lambda _, counts, now: held_back_seats(counts, now) > 0,
    status=lambda counts, gate, now: {"seats_held_back": held_back_seats(counts, now)},
)
