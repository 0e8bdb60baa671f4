"""What the route scheduler shows: its `status` query's answer and its "current details" in
the Temporal UI, derived from its state and the combined gate. Pure (no Temporal, no I/O), as
`backfill.batches.lifecycle` is for the batch workflow; `workflows/scheduler.py` runs the loop and
hands these to Temporal.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from backfill.platform.messages import LiveGateView, SchedulerInput
from backfill.routes import settings as route_settings
from backfill.routes.gates import Gate, GateContext, GateEntry, registry
from backfill.routes.gates import live as live_gate
from backfill.routes.gates import preempt as preempt_gate
from backfill.routes.gates import seats as seats_gate
from backfill.routes.reasons import WaitReason
from backfill.routes.status import BatchStatusEntry, SchedulerStatus

Joined = Callable[[GateEntry[Any]], bool]
"""Whether the scheduler has taken a gate's patch (`GateEntry.patch`) in this run."""


def gate_context(s: SchedulerInput, now: datetime, joined: Joined) -> GateContext:
    """What the gates read of the scheduler's state at `now`."""
    return registry.context(
        s.settings,
        s.gates,
        now=now,
        batch_lines=sum(b.held for b in s.batches.values()),
        cap=s.settings.max_concurrent_lines,
        joined=joined,
    )


def current_gate(s: SchedulerInput, context: GateContext, joined: Joined) -> Gate:
    """The gates' combined answer, the shaping gates (the reopen ramp) applied from their kept
    state (a reading: the scheduler's decision also keeps their next state)."""
    return registry.current(s.settings, s.gates, context, joined)


def live_gate_view(s: SchedulerInput, now: float) -> LiveGateView:
    """The `live_gate` query's answer: what an api process needs to decide whether its live
    count could change the gate, and the route's preemption policy."""
    yielding = live_gate.ENTRY.setting(s.settings)
    seat_aware = seats_gate.ENTRY.setting(s.settings)
    counts = live_gate.STATE.read(s.gates)
    return LiveGateView(
        threshold=yielding.pause_at_in_flight if yielding else None,
        counts={p: c.in_flight for p, c in live_gate.forget_stale(counts, now).items()},
        every_change=seat_aware is not None,
        preempt=preempt_gate.policy(seat_aware, preempt_gate.ENTRY.setting(s.settings)),
    )


def effective_cap(lines_at_once: int, gate: Gate) -> int:
    """Batch lines the route allows now: none while a gate is closed, else "Batch lines at
    once" or the gates' limit (e.g. seats kept free), whichever is lower."""
    if not gate.open:
        return 0
    return lines_at_once if gate.limit is None else min(lines_at_once, gate.limit)


def scheduler_status(s: SchedulerInput, gate: Gate, now: float) -> SchedulerStatus:
    """The status query's answer, derived from state and the gate (pure)."""
    cap = s.settings.max_concurrent_lines
    if gate.open and gate.limit is not None:
        cap = min(cap, gate.limit)  # what the route allows now
    held = sum(b.held for b in s.batches.values())
    waiting = sorted(
        (b for b in s.batches.values() if b.wanted > b.allotment),
        key=lambda b: (b.allotment, b.last_served, b.arrived, b.batch_id),
    )
    positions = {b.batch_id: i + 1 for i, b in enumerate(waiting)}
    entries = []
    for b in sorted(s.batches.values(), key=lambda b: (b.arrived, b.batch_id)):
        reason = None
        if b.wanted > b.allotment:
            # A closed gate, else the ramp, the route's limit itself or slots other batches hold.
            others = held - b.held
            reason = gate.reason or (
                WaitReason.RAMP
                if gate.ramping_to is not None
                else WaitReason.OTHERS_TURN
                if others > 0
                else WaitReason.AT_LIMIT
            )
        entries.append(
            BatchStatusEntry(
                batch_id=b.batch_id,
                workspace=b.workspace,
                wanted=b.wanted,
                allotment=b.allotment,
                held=b.held,
                queue_position=positions.get(b.batch_id),
                reason=reason,
            )
        )
    queued = sum(max(0, b.wanted - b.allotment) for b in s.batches.values())
    return SchedulerStatus(
        route_id=s.route_id,
        settings=s.settings,
        sources=route_settings.sources_of(s.settings, s.sources),
        limit=cap,
        ramping_to=gate.ramping_to,
        allotted=sum(b.allotment for b in s.batches.values()),
        held=held,
        queued_lines=queued,
        batches=entries,
        state="open" if gate.open else "paused",
        reason=gate.reason or (_held_back(gate) if queued else None),
        reason_detail=gate.detail,
        **registry.status_fields(s.gates, gate, now),
    )


def _held_back(gate: Gate) -> WaitReason:
    """Why lines queue on an open route: the reopen ramp while it grows, else the limit."""
    return WaitReason.RAMP if gate.ramping_to is not None else WaitReason.AT_LIMIT


def scheduler_details(status: SchedulerStatus) -> str:
    """The route scheduler's "current details" in the Temporal UI (Temporal markdown, pure):
    state and reason, lines, and each batch's allotment, reason and queue place."""
    head = f"**{status.state}**"
    if status.reason:
        head += f" · {status.reason}"
    if status.reason_detail:
        head += f" ({status.reason_detail})"
    lines = [
        head,
        f"limit {status.limit}"
        + (f" (ramping to {status.ramping_to})" if status.ramping_to is not None else "")
        + f" · allotted {status.allotted} · queued lines {status.queued_lines}"
        f" · live in flight {status.live_in_flight}",
    ]
    for b in status.batches:
        line = f"- {b.batch_id} ({b.workspace}): allotment {b.allotment} of {b.wanted} wanted"
        if b.reason:
            line += f" · {b.reason}"
        if b.queue_position:
            line += f" · place {b.queue_position}"
        lines.append(line)
    return "\n".join(lines)
