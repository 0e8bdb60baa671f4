"""Preemptive yield: when live requests need the seats batch lines hold, the youngest batch lines
give them back at once (their upstream request is closed; the server aborts it) and run again
later. Opt-in per route, and only with seat-aware admission on (it defines the seats).

This gate never closes: admission is seat-aware admission's. What it decides is which running
lines a worker ends, when the gateway's live count needs seats (`lines_to_preempt`, pure), and a
line preempted `max_preemptions` times runs to the end next time. The decision is taken on the
workers, from live counts the api processes send them directly (docs/decisions/0023): a Temporal
signal path is too slow for a live request's time to first token.

With a live-latency target (`live_ttft_target_ms`) the workers also hold seats back from batch
lines, beyond `keep_free`, while the live time to first token the api processes measure is over
the target (`held_back`, pure): doubling the seats held back each second it is over, giving one
back each second it is well under (docs/decisions/0025).
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from backfill.routes.gates.base import OPEN, FormField, GateAnswer, GateContext, GateEntry
from backfill.routes.gates.seats import SeatAware

MAX_PREEMPTIONS = 100
UNDER_TARGET = 0.7
"""A measured TTFT below this share of the target gives one held-back seat back."""


class Preempt(BaseModel):
    """The settings document's `preempt`."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    max_preemptions: int = Field(default=MAX_PREEMPTIONS, ge=1, le=MAX_PREEMPTIONS)
    """A line preempted this many times runs to the end next time (bounds the wasted work)."""
    live_ttft_target_ms: int | None = Field(default=None, ge=1, le=600_000)
    """The live time to first token (ms) the route promises: while the api processes measure
    more (p90 of their streamed requests over the last seconds), more seats are held back from
    batch lines (None: `keep_free` only)."""
    resume: bool = True
    """A preempted line keeps what it generated and its next run continues it (decision 0036):
    its lines go upstream streamed, and the server must continue an answer (vLLM, SGLang:
    `continue_final_message`). Lines whose continuation would not be the same answer (several
    choices, log probabilities, tools, structured output, `echo`, `best_of`) restart anyway.
    False: every preempted line restarts."""


class PreemptPolicy(BaseModel):
    """What a worker needs to preempt a route's lines (sent with the live counts)."""

    model_config = ConfigDict(frozen=True)

    batch_seats: int
    """Seats batch lines and live requests may fill together: seat-aware admission's `seats −
    keep_free`."""
    max_preemptions: int
    ttft_target_ms: int | None = None
    """`live_ttft_target_ms` (None: no target, nothing held back beyond `keep_free`)."""
    resume: bool = True
    """`resume`: preempted lines continue where they stopped."""


def policy(seat_aware: SeatAware | None, preempt: Preempt | None) -> PreemptPolicy | None:
    """The route's policy, or None when preemption is off (or seat-aware admission is)."""
    if preempt is None or seat_aware is None:
        return None
    return PreemptPolicy(
        batch_seats=seat_aware.seats - seat_aware.keep_free,
        max_preemptions=preempt.max_preemptions,
        ttft_target_ms=preempt.live_ttft_target_ms,
        resume=preempt.resume,
    )


def held_back(held: int, observed_ms: float | None, target_ms: int, ceiling: int) -> int:
    """Seats to hold back from batch lines next, beyond `keep_free`, given those held now and
    the live TTFT measured since (None: no streamed live request to measure). Over the target,
    twice as many (at least one more); under `UNDER_TARGET` of it, or with nothing measured, one
    fewer; between, the same. Always within [0, ceiling]."""
    if observed_ms is None or observed_ms < UNDER_TARGET * target_ms:
        nxt = held - 1
    elif observed_ms > target_ms:
        nxt = max(held + 1, 2 * held)
    else:
        nxt = held
    return max(0, min(ceiling, nxt))


def excess(policy: PreemptPolicy, live: int, batch_sending: int) -> int:
    """Seats live traffic needs back from batch lines: live + batch lines over the seats they
    share (0: none)."""
    return max(0, live + batch_sending - policy.batch_seats)


def may_send(policy: PreemptPolicy, live: int, batch_sending: int) -> bool:
    """Whether one more batch line may go upstream now (a seat is free beside live traffic)."""
    return live + batch_sending + 1 <= policy.batch_seats


def lines_to_preempt(
    started: Sequence[float],
    preemptible: Sequence[bool],
    count: int,
    owners: Sequence[str] | None = None,
) -> list[int]:
    """Indexes of the `count` youngest preemptible lines (latest `started` first; equal ones by
    `owners`, the worker running each, so every worker holding the same lines chooses the same).
    The youngest have generated the least, so ending them wastes the least."""
    order = sorted(
        (i for i in range(len(started)) if preemptible[i]),
        key=lambda i: (started[i], owners[i] if owners is not None else ""),
        reverse=True,
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
    summary=lambda s: (
        f"at most {s.max_preemptions} times a line"
        + (f", live TTFT target {s.live_ttft_target_ms} ms" if s.live_ttft_target_ms else "")
        + ("" if s.resume else ", preempted lines restart")
    ),
    form=(
        FormField("max_preemptions", "Preemptions per line (blank: off)"),
        FormField("live_ttft_target_ms", "Live TTFT target, ms (blank: none)"),
    ),
)
