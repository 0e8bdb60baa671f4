"""Preemptive yield: when live requests need the seats batch lines hold, the youngest batch lines
give them back at once (their upstream request is closed; the server aborts it) and run again
later. Opt-in per route, and only with seat-aware admission on (it defines the seats).

This gate never closes: admission is seat-aware admission's. What it decides is which running
lines a worker ends, when the gateway's live count needs seats (`lines_to_preempt`, pure), and a
line preempted `max_preemptions` times runs to the end next time. The decision is taken on the
workers, from live counts the api processes send them directly (docs/decisions/0023): a Temporal
signal path is too slow for a live request's time to first token.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from backfill.gates.base import OPEN, FormField, GateAnswer, GateContext, GateEntry
from backfill.gates.seats import SeatAware

MAX_PREEMPTIONS = 100


class Preempt(BaseModel):
    """The settings document's `preempt`."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    max_preemptions: int = Field(default=3, ge=1, le=MAX_PREEMPTIONS)
    """A line preempted this many times runs to the end next time (bounds the wasted work)."""


class PreemptPolicy(BaseModel):
    """What a worker needs to preempt a route's lines (sent with the live counts)."""

    model_config = ConfigDict(frozen=True)

    batch_seats: int
    """Seats batch lines and live requests may fill together: seat-aware admission's `seats −
    keep_free`."""
    max_preemptions: int


def policy(seat_aware: SeatAware | None, preempt: Preempt | None) -> PreemptPolicy | None:
    """The route's policy, or None when preemption is off (or seat-aware admission is)."""
    if preempt is None or seat_aware is None:
        return None
    return PreemptPolicy(
        batch_seats=seat_aware.seats - seat_aware.keep_free,
        max_preemptions=preempt.max_preemptions,
    )


def excess(policy: PreemptPolicy, live: int, batch_sending: int) -> int:
    """Seats live traffic needs back from batch lines: live + batch lines over the seats they
    share (0: none)."""
    return max(0, live + batch_sending - policy.batch_seats)


def may_send(policy: PreemptPolicy, live: int, batch_sending: int) -> bool:
    """Whether one more batch line may go upstream now (a seat is free beside live traffic)."""
    return live + batch_sending + 1 <= policy.batch_seats


def lines_to_preempt(
    started: Sequence[float], preemptible: Sequence[bool], count: int
) -> list[int]:
    """Indexes of the `count` youngest preemptible lines (latest `started` first). The youngest
    have generated the least, so ending them wastes the least."""
    order = sorted(
        (i for i in range(len(started)) if preemptible[i]), key=lambda i: started[i], reverse=True
    )
    return order[: max(0, count)]


def decide(setting: Preempt, ctx: GateContext) -> GateAnswer:
    """Never closed: the gate acts on running lines, not on admission."""
    return OPEN


ENTRY = GateEntry(
    name="preempt",
    label="Preemptive yield",
    model=Preempt,
    decide=decide,
    doc='"Preemptive yield": with seat-aware admission on, when live requests need the seats '
    "batch lines hold, the youngest lines are ended at once and run again later (null: off).",
    summary=lambda s: f"at most {s.max_preemptions} times a line",
    form=(FormField("max_preemptions", "Preemptions per line (blank: off)"),),
)
