"""The registry: every gate, in the order they are checked, and what is derived from it.

The route scheduler (`workflows/scheduler.py`) runs the gates only through these functions and
knows none by name: `context` builds what decisions read from the recorded states, `route_gate`
is the combined decision and `shaped` applies the gates that shape it (the reopen ramp),
`apply_signal` records a gate's signal, `readers` says which reader activities should run,
`status_fields` gives the gates' fields of the status. `SETTINGS_GATES` are the gates with a field
in the route settings document (`backfill.routes.settings.RouteSettings`, which declares one per
gate, named as the entry) and the rows of the console's route page. Adding a gate: its module
(settings model, state, signals, reader, decision, entry), one line in `GATES` (and its field in
`RouteSettings` when it has settings), its reason and tests (docs/decisions/0040).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from backfill.routes.gates import (
    backoff,
    live,
    maintenance,
    preempt,
    ramp,
    seats,
    server_load,
    window,
)
from backfill.routes.gates.base import Gate, GateContext, GateEntry, GateSignal

GATES: tuple[GateEntry[Any], ...] = (
    maintenance.ENTRY,
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

_added: list[GateEntry[Any]] = []
"""Gates registered by `registered` (tests only), checked after `GATES`."""


def entries() -> tuple[GateEntry[Any], ...]:
    """Every gate the scheduler runs, in order."""
    return GATES + tuple(_added)


@contextmanager
def registered(entry: GateEntry[Any]) -> Iterator[GateEntry[Any]]:
    """`entry` runs after the registry's gates while the block lasts: for a gate defined in a
    test (every worker replaying a history must run the same gates, so production gates are
    lines of `GATES`). A gate with settings needs its field declared in `RouteSettings`: it
    cannot be added here."""
    if entry.model is not None:
        raise ValueError(f"gate {entry.name!r} has settings: add it to GATES")
    if any(e.name == entry.name for e in entries()):
        raise ValueError(f"gate {entry.name!r} is registered already")
    _added.append(entry)
    try:
        yield entry
    finally:
        _added.remove(entry)


def context(
    settings: BaseModel,
    states: Mapping[str, Any],
    *,
    now: Any,
    batch_lines: int,
    cap: int,
    joined: Callable[[GateEntry[Any]], bool],
) -> GateContext:
    """What the decisions read at `now`: each gate's recorded state, typed (a gate behind a
    patch the scheduler has not taken yet, `joined` false: its initial state)."""
    typed = {
        e.state.key: e.state.read(states) if e.patch is None or joined(e) else e.state.initial()
        for e in entries()
        if e.state is not None
    }
    return GateContext(now=now, states=typed, batch_lines=batch_lines, cap=cap)


def route_gate(
    settings: BaseModel, ctx: GateContext, gates: tuple[GateEntry[Any], ...] | None = None
) -> Gate:
    """Whether a new line may start on the route at `ctx.now`, checking every gate that is on,
    in order. The first closed gate names the reason; `wake_at` is the earliest time at which
    any gate checked so far may change its answer."""
    wakes: list[float] = []
    limit: int | None = None
    for entry in entries() if gates is None else gates:
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


def shaped(
    gate: Gate,
    settings: BaseModel,
    states: Mapping[str, Any],
    ctx: GateContext,
    joined: Callable[[GateEntry[Any]], bool],
) -> tuple[Gate, dict[str, Any]]:
    """`gate` after every shaping gate that is on and has joined, in order, and the states
    they keep (a shaping gate that is off goes back to its initial state; one on but not
    joined keeps its state as it is)."""
    kept: dict[str, Any] = {}
    for e in entries():
        if e.shape is None:
            continue
        value = e.setting(settings)
        if value is None:
            if e.state is not None:
                kept[e.state.key] = e.state.initial()
            continue
        if not (e.patch is None or joined(e)):
            continue
        before = e.state.read(states) if e.state is not None else None
        gate, after = e.shape(gate, value, before, ctx)
        if e.state is not None:
            kept[e.state.key] = after
    return gate, kept


def current(
    settings: BaseModel,
    states: Mapping[str, Any],
    ctx: GateContext,
    joined: Callable[[GateEntry[Any]], bool],
) -> Gate:
    """The combined answer with the shaping gates applied (a reading: nothing is kept)."""
    gate, _ = shaped(route_gate(settings, ctx), settings, states, ctx, joined)
    return gate


def signal(name: str) -> tuple[GateEntry[Any], GateSignal] | None:
    """The gate and its signal called `name` (None: no gate's)."""
    for e in entries():
        for s in e.signals:
            if s.name == name:
                return e, s
    return None


def apply_signal(
    states: dict[str, Any], entry: GateEntry[Any], sig: GateSignal, payload: Any, now: float
) -> None:
    """Record `sig` with `payload` at `now` in `states` (the gate's state, changed in place)."""
    assert entry.state is not None, f"gate {entry.name!r} has a signal but no state"
    states[entry.state.key] = sig.apply(entry.state.read(states), payload, now)


def on_settings_change(old: BaseModel, new: BaseModel, states: dict[str, Any]) -> None:
    """Start over the state of each gate whose setting changed and that asks for it."""
    for e in entries():
        if e.state is not None and e.state.reset_on_change and e.setting(old) != e.setting(new):
            states[e.state.key] = e.state.initial()


@dataclass(frozen=True)
class ReaderRun:
    """A reader activity the scheduler should run."""

    activity: str
    input: BaseModel


def readers(settings: BaseModel, route_id: str) -> dict[str, ReaderRun]:
    """The reader activities wanted, by gate name (every gate that has one and is on)."""
    out: dict[str, ReaderRun] = {}
    for e in entries():
        value = e.setting(settings)
        if e.reader is not None and (e.model is None or value is not None):
            out[e.name] = ReaderRun(e.reader.activity, e.reader.input(route_id, value))
    return out


def status_fields(states: Mapping[str, Any], gate: Gate, now: float) -> dict[str, Any]:
    """The gates' fields of the scheduler's status (`SchedulerStatus`)."""
    out: dict[str, Any] = {}
    for e in entries():
        if e.status is not None:
            out.update(e.status(e.state.read(states) if e.state else None, gate, now))
    return out
