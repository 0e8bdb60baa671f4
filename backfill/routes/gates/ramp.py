"""The reopen ramp (slow start): when the route's limit rises (a gate reopens, seat-aware
admission frees seats, the cap is raised), batch lines restart at a bounded pace instead of all
at once.

The ramp starts at `initial` lines, or at what the route already allowed or ran if that is more
(lines still running are no burst), and doubles every `double_every_s` seconds until it reaches
what the gates allow. Doubling reaches any limit (at most 256) in a handful of steps, so a ramp
costs the scheduler a few timers, not one per line. Off (null) by default: the limit follows the
gates at once, as it always did.

This gate never closes and limits nothing by its own decision (`decide`): it acts on the other
gates' combined limit (`ramped`, its entry's `shape`), from the state the scheduler keeps
(`RampState`). `ramp` is the pure step, given that state and workflow time (docs/decisions/0024).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from pydantic import BaseModel, ConfigDict, Field

from backfill.routes.gates.base import (
    OPEN,
    FormField,
    Gate,
    GateAnswer,
    GateContext,
    GateEntry,
    GateState,
)
from backfill.routes.gates.cap import MAX_LINES_AT_ONCE

MIN_DOUBLE_EVERY_S = 0.5
MAX_DOUBLE_EVERY_S = 3600.0
DUE_SLACK_S = 0.001
"""A doubling this close is due: the timer set for it fires at its time, which floating point
on Unix timestamps may put a hair before it."""
MAX_DOUBLINGS = 30
"""Past this many doublings any start has passed every limit (2^30 > 256 lines)."""


class ReopenRamp(BaseModel):
    """The settings document's `reopen_ramp`."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    initial: int = Field(default=1, ge=1, le=MAX_LINES_AT_ONCE)
    """Batch lines the route allows when its limit rises (more if that many already ran)."""
    double_every_s: float = Field(default=1.0, ge=MIN_DOUBLE_EVERY_S, le=MAX_DOUBLE_EVERY_S)
    """Seconds between doublings of the allowed lines, up to the gates' limit."""


class RampState(BaseModel):
    """What the route scheduler keeps of the ramp (in its state, carried over continue-as-new)."""

    allowed: int | None = None
    """Batch lines the route allowed at the last decision, the ramp included (None: none yet
    since the ramp was set): a rise above it starts a ramp."""
    start: int = 0
    """Lines allowed when the current ramp began."""
    since: float | None = None
    """When it began (unix seconds, workflow time); None: not ramping."""


@dataclass(frozen=True)
class RampStep:
    """The ramp's answer at one instant."""

    limit: int
    """Batch lines the route allows now (at most the gates' limit)."""
    wake_at: float | None
    """When `limit` doubles next (None: not ramping; the gates' limit holds)."""
    state: RampState
    """The state to keep."""


def ramp(
    setting: ReopenRamp, state: RampState | None, target: int, running: int, now: float
) -> RampStep:
    """The route's limit at `now` given `target`, the lines every other gate and the cap allow
    (0 while one is closed), and `running`, the batch lines the route counts as running.

    A `target` above the limit last allowed starts a ramp at max(`initial`, that limit,
    `running`); it doubles every `double_every_s` until it reaches `target` (a `target` that
    moves meanwhile is followed: the ramp goes on at its pace, a lower one applies at once). A
    closed gate ends the ramp: the next reopen ramps again. Pure: the status query asks it too,
    and keeps nothing."""
    state = state or RampState()
    done = RampStep(limit=max(0, target), wake_at=None, state=RampState(allowed=max(0, target)))
    if target <= 0:
        return done
    if state.since is not None:
        start, since = state.start, state.since
    elif state.allowed is not None and target > state.allowed:
        start, since = max(setting.initial, state.allowed, running), now
    else:
        return done
    doublings = math.floor((max(0.0, now - since) + DUE_SLACK_S) / setting.double_every_s)
    level = start * 2 ** min(doublings, MAX_DOUBLINGS)
    if level >= target:
        return done
    return RampStep(
        limit=level,
        wake_at=since + (doublings + 1) * setting.double_every_s,
        state=RampState(allowed=level, start=start, since=since),
    )


def decide(setting: ReopenRamp, ctx: GateContext) -> GateAnswer:
    """Never closed: the ramp acts on the other gates' combined limit (`ramped`)."""
    return OPEN


def ramped(
    gate: Gate, setting: ReopenRamp, state: RampState | None, ctx: GateContext
) -> tuple[Gate, RampState]:
    """`gate` with the reopen ramp applied (`ramp`), and the ramp's state to keep: while it
    ramps, the limit is the ramp's and `wake_at` includes its next doubling; otherwise the gate
    is unchanged."""
    target = 0 if not gate.open else ctx.cap if gate.limit is None else min(ctx.cap, gate.limit)
    step = ramp(setting, state, target, ctx.batch_lines, ctx.at)
    if step.wake_at is None:
        return gate, step.state
    wake = step.wake_at if gate.wake_at is None else min(gate.wake_at, step.wake_at)
    return replace(gate, limit=step.limit, wake_at=wake, ramping_to=target), step.state


STATE = GateState(key="ramp", type=RampState | None, initial=lambda: None)
"""The ramp's state while `reopen_ramp` is set (None: off, or not decided yet)."""


def _summary(s: ReopenRamp) -> str:
    lines = "line" if s.initial == 1 else "lines"
    return f"from {s.initial} {lines}, doubling every {s.double_every_s:g} s"


ENTRY = GateEntry(
    name="reopen_ramp",
    label="Reopen ramp",
    model=ReopenRamp,
    decide=decide,
    doc='"Reopen ramp" (slow start): when the route\'s limit rises (a gate reopens, seats free '
    "up, the cap is raised), batch lines restart at `initial` and double every "
    "`double_every_s` seconds up to it, instead of all at once (null: off, all at once).",
    off="off (all at once)",
    summary=_summary,
    form=(
        FormField("initial", "Lines at a reopen (blank: off)"),
        FormField("double_every_s", "Doubling every (seconds)"),
    ),
    state=STATE,
    shape=ramped,
    patch="reopen-ramp",
)
