"""What every gate is: its answer, what it reads, and its registry entry.

Pure (pydantic and the standard library; no temporalio, no I/O, no clock). A gate is one module
of this package holding its whole life in its entry: its settings model, its state and the
signals that change it, its reader activity, its decision, its shaping of the combined answer
and its status fields; `backfill.routes.gates.registry` lists the entries in the order they are
checked, and the route scheduler runs them without knowing any by name (docs/decisions/0040).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any, Generic, TypeVar, cast

from pydantic import BaseModel, TypeAdapter

from backfill.routes.reasons import WaitReason

S = TypeVar("S", bound=BaseModel)


@dataclass(frozen=True)
class GateContext:
    """What the route scheduler knows that a decision may read (its recorded state, as of `now`)."""

    now: datetime
    """Workflow time (timezone-aware)."""
    states: Mapping[str, Any] = field(default_factory=dict)
    """Each gate's state by its key (`GateState.key`), typed; a gate reads its own and may read
    another's through that gate's module (e.g. seat-aware admission reads the live counts). A
    key missing: that gate's initial state (`state_of`)."""
    batch_lines: int = 0
    """Batch lines the route counts as running (the slots batches hold)."""
    cap: int = 2
    """"Batch lines at once"."""

    @property
    def at(self) -> float:
        return self.now.timestamp()

    def state_of(self, state: GateState) -> Any:
        """The state `state` describes, as the scheduler recorded it (its initial one if none)."""
        return state.read(self.states)


@dataclass(frozen=True)
class GateAnswer:
    """One gate's answer."""

    open: bool
    reason: WaitReason | None = None
    """Why it is closed."""
    detail: str | None = None
    """More for an operator (e.g. the metrics error)."""
    wake_at: float | None = None
    """When the answer may change with time alone (unix seconds)."""
    limit: int | None = None
    """While open: at most this many batch lines on the route (None: no limit of its own)."""


OPEN = GateAnswer(True)


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


@dataclass(frozen=True)
class GateState:
    """The state a gate keeps in the route scheduler (`SchedulerInput.gates[key]`): recorded by
    its signals, carried over continue-as-new, read by decisions through `GateContext`."""

    key: str
    """Its key in `SchedulerInput.gates` (kept stable: recorded histories carry it)."""
    type: Any
    """Its type, for pydantic (e.g. `dict[str, LiveCount]`, `Backoff`, `LoadVerdict | None`)."""
    initial: Callable[[], Any]
    """The state before any signal (and after a reset)."""
    reset_on_change: bool = False
    """A change of the gate's setting starts the state over (e.g. a new metrics URL: no verdict
    yet)."""

    @cached_property
    def _adapter(self) -> TypeAdapter[Any]:
        return TypeAdapter(self.type)

    def read(self, states: Mapping[str, Any]) -> Any:
        """The typed state in `states` (as decoded from history, or as a signal left it)."""
        if self.key not in states:
            return self.initial()
        return self._adapter.validate_python(states[self.key])


@dataclass(frozen=True)
class GateSignal:
    """A route scheduler signal that changes a gate's state (handled by the scheduler's one
    dynamic signal handler, by name)."""

    name: str
    """The signal's name (as `backfill.platform.refs.RouteSchedulerWorkflow` declares it for
    callers)."""
    payload: type[BaseModel]
    """Its argument."""
    apply: Callable[[Any, Any, float], Any]
    """The new state from the state, the payload and the workflow time (unix seconds); pure."""


@dataclass(frozen=True)
class Reader:
    """A gate's reader: a long-running activity that reads what the decision needs from outside
    and signals the scheduler (one of the gate's `signals`) when its reading changes. The
    scheduler runs it while the gate is on and some batch wants lines, restarts it when its
    input changes, cancels it otherwise (30 s heartbeat, retried)."""

    activity: str
    """The activity's name."""
    input: Callable[[str, Any], BaseModel]
    """Its input from the route id and the gate's setting."""


@dataclass(frozen=True)
class FormField:
    """One field of a gate's fieldset on the console's Edit form."""

    key: str
    """Its name in the gate's settings document (e.g. `from` in `time_window`)."""
    label: str
    numeric: bool = True
    choices: tuple[str, ...] = ()
    """Check boxes with these values (a list field) instead of a text box."""


@dataclass(frozen=True)
class GateEntry(Generic[S]):
    """A gate in the registry."""

    name: str
    """Its field in the route settings document (for a gate with settings)."""
    label: str
    """What the console and docs call it."""
    decide: Callable[[S, GateContext], GateAnswer]
    """The pure decision, given the gate's settings (only while it is on; None for a gate
    without settings) and the scheduler's state."""
    model: type[S] | None = None
    """Its settings model (None: the gate has no settings and is always on)."""
    doc: str = ""
    """The settings field's description (OpenAPI)."""
    off: str = "off"
    """How the console shows the gate when its setting is null."""
    summary: Callable[[S], str] = str
    """One line for the console's read-only view of a setting."""
    form: tuple[FormField, ...] = ()
    """Its fieldset on the console's Edit form (the first field's label says what blank means)."""
    state: GateState | None = None
    """The state it keeps (None: it decides from its settings, the time and others' state)."""
    signals: tuple[GateSignal, ...] = ()
    """The scheduler signals that change its state."""
    reader: Reader | None = None
    """The activity that reads what the decision needs from outside (None: it needs no I/O)."""
    shape: Callable[[Gate, S, Any, GateContext], tuple[Gate, Any]] | None = None
    """Applied to the combined answer while the gate is on (and has joined): the answer and the
    gate's next state (e.g. the reopen ramp lowers the limit while it grows). While the gate is
    off its state goes back to the initial one."""
    patch: str | None = None
    """The `workflows.patches` name behind which the gate changes what the scheduler does: its
    state counts in decisions (and `shape` applies) only once the scheduler has asked it, which
    it does the first time `joins` holds (None: always counts)."""
    joins: Callable[[S | None, Any, float], bool] | None = None
    """When to ask `patch`, from the setting, the state and the time (None: whenever on)."""
    status: Callable[[Any, Gate, float], Mapping[str, Any]] | None = None
    """Its fields of the scheduler's status (`SchedulerStatus`) from its state, the combined
    answer and the time."""

    def wants_patch(self, settings: BaseModel, states: Mapping[str, Any], now: float) -> bool:
        """Whether the scheduler should ask this gate's patch now."""
        if self.patch is None:
            return False
        value = self.setting(settings)
        if self.joins is None:
            return self.model is None or value is not None
        return self.joins(value, self.state.read(states) if self.state else None, now)

    def setting(self, settings: BaseModel) -> S | None:
        """This gate's settings in a route settings document (None: off, or no settings)."""
        if self.model is None:
            return None
        value: S | None = getattr(settings, self.name)
        return value

    def answer(self, settings: BaseModel, ctx: GateContext) -> GateAnswer | None:
        """The decision, or None when the gate is switched off."""
        value = self.setting(settings)
        if self.model is not None and value is None:
            return None
        return self.decide(cast(S, value), ctx)

    def form_values(self, value: S | None) -> dict[str, Any]:
        """The Edit form's values (`name.key`) showing `value`."""
        doc = value.model_dump(by_alias=True) if value is not None else {}
        out: dict[str, Any] = {}
        for f in self.form:
            v = doc.get(f.key)
            if f.choices:
                out[f"{self.name}.{f.key}"] = list(v or [])
            else:
                out[f"{self.name}.{f.key}"] = "" if v is None else str(v)
        return out

    def document(self, values: Mapping[str, Any]) -> dict[str, Any] | None:
        """The gate's settings document from the form's values: the fields filled in, or None
        (off) when every field is blank. Validation is the model's, as for the JSON API."""
        doc = {f.key: values.get(f"{self.name}.{f.key}") for f in self.form}
        doc = {k: v for k, v in doc.items() if v not in (None, "", [])}
        return doc or None
