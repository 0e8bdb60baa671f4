"""What every gate is: its answer, what it reads, and its registry entry.

Pure (pydantic and the standard library; no temporalio, no I/O, no clock). A gate is one module
of this package holding its settings model, its decision and its entry; `backfill.gates.registry`
lists the entries in the order they are checked.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from pydantic import BaseModel

from backfill.reasons import WaitReason

if TYPE_CHECKING:  # the gates' own state types (their modules import this one)
    from backfill.gates.backoff import Backoff
    from backfill.gates.live import LiveCount
    from backfill.gates.seats import HeldBackCount
    from backfill.gates.server_load import LoadVerdict

S = TypeVar("S", bound=BaseModel)


@dataclass(frozen=True)
class GateContext:
    """What the route scheduler knows that a decision may read (its recorded state, as of `now`)."""

    now: datetime
    """Workflow time (timezone-aware)."""
    backoff: Backoff | None = None
    """The route's rate-limit back-off (None: none recorded)."""
    live: Mapping[str, LiveCount] = field(default_factory=dict)
    """Each api process's last reported live count."""
    load: LoadVerdict | None = None
    """The server-load watcher's last verdict (None: none since the signal was set)."""
    batch_lines: int = 0
    """Batch lines the route counts as running (the slots batches hold)."""
    cap: int = 2
    """"Batch lines at once"."""
    held_back: Mapping[str, HeldBackCount] = field(default_factory=dict)
    """Seats each worker holds back for the live-latency target, as it last reported them
    (empty on a run from before the patch `seats-held-back`)."""

    @property
    def at(self) -> float:
        return self.now.timestamp()


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
    reader: str | None = None
    """The activity that reads what the decision needs from outside (None: it needs no I/O)."""

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
