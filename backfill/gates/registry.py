"""The registry: every gate, in the order they are checked, and what is derived from it.

`route_gate` is the scheduler's combined decision; `settings_fields` the gates' fields of the
route settings document (`backfill.messages.RouteSettings`); `SETTINGS_GATES` the rows of the
console's route page. Adding a gate: its module (settings model, decision, entry), one line
here, its reader activity if it needs I/O, and tests.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Optional

from pydantic import BaseModel, Field

from backfill.gates import backoff, live, preempt, ramp, seats, server_load, window
from backfill.gates.base import GateContext, GateEntry
from backfill.gates.ramp import RampState, ReopenRamp

GATES: tuple[GateEntry[Any], ...] = (
    window.ENTRY,
    backoff.ENTRY,
    live.ENTRY,
    server_load.ENTRY,
    seats.ENTRY,
    preempt.ENTRY,
    ramp.ENTRY,
)
"""Checked in this order: the first closed gate names the reason."""

SETTINGS_GATES: tuple[GateEntry[Any], ...] = tuple(e for e in GATES if e.model is not None)
"""The gates an operator sets (a field each in the route settings document, null when off)."""


@dataclass(frozen=True)
class Gate:
    """The route's combined answer: may a new batch line start now, and if not, why."""

    open: bool
    reason: str | None = None
    """Why it is closed (a `WaitReason`)."""
    detail: str | None = None
    """More for an operator (e.g. the metrics error)."""
    wake_at: float | None = None
    """When the answer may change with time alone (a back-off ending, a live count expiring,
    a window's edge)."""
    limit: int | None = None
    """While open: the fewest batch lines any open gate allows (None: only the cap limits)."""
    ramping_to: int | None = None
    """While the reopen ramp holds `limit` below what the gates and the cap allow: that."""


def route_gate(
    settings: BaseModel, ctx: GateContext, gates: tuple[GateEntry[Any], ...] = GATES
) -> Gate:
    """Whether a new line may start on the route at `ctx.now`, checking every gate that is on,
    in order. The first closed gate names the reason; `wake_at` is the earliest time at which
    any gate checked so far may change its answer."""
    wakes: list[float] = []
    limit: int | None = None
    for entry in gates:
        answer = entry.answer(settings, ctx)
        if answer is None:  # switched off
            continue
        if answer.wake_at is not None:
            wakes.append(answer.wake_at)
        wake = min(wakes) if wakes else None
        if not answer.open:
            return Gate(False, answer.reason, answer.detail, wake)
        if answer.limit is not None:
            limit = answer.limit if limit is None else min(limit, answer.limit)
    return Gate(True, wake_at=min(wakes) if wakes else None, limit=limit)


def ramped(
    gate: Gate, setting: ReopenRamp, state: RampState | None, ctx: GateContext
) -> tuple[Gate, RampState]:
    """`gate` with the reopen ramp applied (`ramp.ramp`), and the ramp's state to keep: while
    it ramps, the limit is the ramp's and `wake_at` includes its next doubling; otherwise the
    gate is unchanged."""
    target = 0 if not gate.open else ctx.cap if gate.limit is None else min(ctx.cap, gate.limit)
    step = ramp.ramp(setting, state, target, ctx.batch_lines, ctx.at)
    if step.wake_at is None:
        return gate, step.state
    wake = step.wake_at if gate.wake_at is None else min(gate.wake_at, step.wake_at)
    return replace(gate, limit=step.limit, wake_at=wake, ramping_to=target), step.state


def settings_fields() -> dict[str, Any]:
    """The gates' fields of the route settings document, for `pydantic.create_model`: each an
    optional gate settings model, null (off) by default."""
    return {
        e.name: (Optional[e.model], Field(default=None, description=e.doc))  # noqa: UP045
        for e in SETTINGS_GATES
    }
