"""Seat-aware admission: batch lines take only the server's seats that live traffic leaves.

The server runs at most `seats` requests at once (vLLM's `--max-num-seqs` × engines). The batch
allotment at any instant is `seats − keep_free − live in flight − other running requests`,
clamped to [0, "Batch lines at once"]: the live count is the gateway's own (as "Yield to live
traffic" counts it); the other running requests are the server-load reading's running count
minus the batch lines the route runs, while a fresh reading is there (the server-load signal on),
else none. No seat left: closed, "Keeping seats free for live traffic".
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from backfill.gates.base import FormField, GateAnswer, GateContext, GateEntry
from backfill.gates.live import live_expiry, live_in_flight
from backfill.reasons import WaitReason

MAX_SEATS = 100_000
READING_FRESH_SECONDS = 15.0
"""A server-load reading older than this is not counted (the watcher reads every 5 s but
signals only when its verdict changes)."""


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


def others_running(ctx: GateContext) -> tuple[int, float | None]:
    """Requests the server reports running besides the route's batch lines (0 without a fresh
    reading), and when that reading stops being fresh."""
    reading = ctx.load.reading if ctx.load is not None else None
    if reading is None or reading.running is None:
        return 0, None
    stale_at = reading.read_at + READING_FRESH_SECONDS
    if ctx.at >= stale_at:
        return 0, None
    return max(0, int(reading.running) - ctx.batch_lines), stale_at


def decide(setting: SeatAware, ctx: GateContext) -> GateAnswer:
    """The batch lines the free seats allow (a limit), or closed when none is free."""
    live = live_in_flight(ctx.live, ctx.at)
    others, stale_at = others_running(ctx)
    free = setting.seats - setting.keep_free - live - others
    allowed = max(0, min(free, ctx.cap))
    wakes = [t for t in (live_expiry(ctx.live, ctx.at), stale_at) if t is not None]
    wake = min(wakes) if wakes else None
    if allowed == 0:
        detail = (
            f"{setting.seats} seats: {setting.keep_free} kept free, {live} live, {others} other"
        )
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
)
