"""A route's batch-scheduling settings (`RouteSettings`, the management API's document), declared in
the config file as code, and where each of them came from (docs/decisions/0039).

A route's `settings` table in the config file is applied to its scheduler when the scheduler
starts, and again whenever a worker starts with a table that differs from the one last applied:
then every field the table declares takes the file's value, whatever a `PUT` set before. Between
two such changes a `PUT` wins. Each setting's source (`config`, `admin_api` or `default`) is kept
with the settings and shown in the route's status.

Pure: no I/O, nothing from temporalio; the scheduler workflow, the api and the config share it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from backfill.routes.gates import live as live_gate
from backfill.routes.gates import maintenance as maintenance_gate
from backfill.routes.gates import preempt as preempt_gate
from backfill.routes.gates import ramp as ramp_gate
from backfill.routes.gates import seats as seats_gate
from backfill.routes.gates import server_load as load_gate
from backfill.routes.gates import window as window_gate
from backfill.routes.gates.cap import DEFAULT_LINES_AT_ONCE, LinesAtOnce
from backfill.routes.gates.live import YieldToLiveTraffic
from backfill.routes.gates.maintenance import MaintenanceHold
from backfill.routes.gates.preempt import Preempt
from backfill.routes.gates.ramp import ReopenRamp
from backfill.routes.gates.seats import SeatAware
from backfill.routes.gates.server_load import ServerLoadSettings
from backfill.routes.gates.window import TimeWindow
from backfill.upstream.load_metrics import approve_metrics_url


class RouteSettings(BaseModel):
    """A route's batch-scheduling settings: the management API's settings document, held
    durably in the scheduler's state. `max_concurrent_lines`, then one field per gate an
    operator sets (`backfill.routes.gates.registry`: null when off), then `priority_hint`."""

    model_config = ConfigDict(extra="forbid", json_schema_serialization_defaults_required=True)

    max_concurrent_lines: LinesAtOnce = Field(
        default=DEFAULT_LINES_AT_ONCE,
        description='"Batch lines at once": batch lines running on the route across every '
        "batch and process.",
    )
    # One field per gate with settings, named as its registry entry and in the registry's order
    # (`tests/unit/test_gates.py` holds them together); its description is the entry's `doc`.
    maintenance: MaintenanceHold | None = Field(
        default=None, description=maintenance_gate.ENTRY.doc
    )
    time_window: TimeWindow | None = Field(default=None, description=window_gate.ENTRY.doc)
    yield_to_live_traffic: YieldToLiveTraffic | None = Field(
        default=None, description=live_gate.ENTRY.doc
    )
    server_load: ServerLoadSettings | None = Field(default=None, description=load_gate.ENTRY.doc)
    seat_aware: SeatAware | None = Field(default=None, description=seats_gate.ENTRY.doc)
    preempt: Preempt | None = Field(default=None, description=preempt_gate.ENTRY.doc)
    reopen_ramp: ReopenRamp | None = Field(default=None, description=ramp_gate.ENTRY.doc)
    priority_hint: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="vLLM's `priority` sent in the body of batch lines (never live "
        "requests); lower runs first under vLLM's priority scheduling policy, so a large "
        "value puts batch lines behind live ones. `vllm` routes only (null: off).",
    )


SettingSource = Literal["config", "admin_api", "default"]
"""Where a setting's value came from: the route's `settings` table in the config file (or the
route's own `max_concurrent_lines`), a `PUT` of the management API (or the console's form), or
neither (the default)."""


class ConfiguredSettings(BaseModel):
    """A route's settings as the config file declares them: the scheduler's `configure` signal,
    sent by each worker at start, and part of the scheduler's input when it starts."""

    declared: dict[str, Any] = Field(default_factory=dict)
    """The route's `settings` table, as JSON values, only the fields it declares (empty: none)."""
    cap: int | None = None
    """The route's own `max_concurrent_lines` when the file sets it: applied when the scheduler
    starts, never again (what it always was)."""


@dataclass(frozen=True)
class Applied:
    """The settings after the config file's table was applied, with their sources."""

    settings: RouteSettings
    sources: dict[str, SettingSource]
    declared: dict[str, Any]
    """The table applied (kept to tell the next one's changes)."""


def declared_settings(settings: RouteSettings | None) -> dict[str, Any]:
    """The fields a `settings` table declares, as JSON values (empty without a table)."""
    if settings is None:
        return {}
    return settings.model_dump(mode="json", include=settings.model_fields_set)


def initial(configured: ConfiguredSettings) -> Applied:
    """A new scheduler's settings: the defaults, the route's `max_concurrent_lines` when the file
    sets it, then the `settings` table."""
    doc: dict[str, Any] = {}
    if configured.cap is not None:
        doc["max_concurrent_lines"] = configured.cap
    doc.update(configured.declared)
    settings = RouteSettings.model_validate(doc)
    sources: dict[str, SettingSource] = dict.fromkeys(doc, "config")
    return Applied(settings, sources_of(settings, sources), configured.declared)


def sources_of(
    settings: RouteSettings, recorded: dict[str, SettingSource]
) -> dict[str, SettingSource]:
    """Every field's source, in the document's order: the recorded one, else `default` when the
    value is the default and `admin_api` when not (a scheduler started before sources were kept
    had its settings changed only by `PUT`, but for its initial cap)."""
    defaults = _DEFAULTS
    current = settings.model_dump(mode="json")
    return {
        name: recorded.get(name) or ("default" if value == defaults[name] else "admin_api")
        for name, value in current.items()
    }


def after_put(
    old: RouteSettings, new: RouteSettings, recorded: dict[str, SettingSource]
) -> dict[str, SettingSource]:
    """The sources after a `PUT` replaced `old` with `new`: a field whose value changed comes from
    the admin API, the others keep theirs (the console's form sends every field)."""
    before, after = old.model_dump(mode="json"), new.model_dump(mode="json")
    sources = sources_of(old, recorded)
    return {
        name: "admin_api" if value != before[name] else sources[name]
        for name, value in after.items()
    }


def apply_config(
    settings: RouteSettings,
    recorded: dict[str, SettingSource],
    last: dict[str, Any] | None,
    configured: ConfiguredSettings,
) -> Applied | None:
    """The settings after the config file's table `configured` reached a running scheduler
    whose last applied table is `last` (None: it started before settings as code); None when
    nothing changes.

    A table equal to the last one changes nothing: a `PUT` since wins. A different one is
    applied whole: every field it declares takes its value; a field the last one declared and
    this one does not, still as the file set it, returns to its default."""
    sources = sources_of(settings, recorded)
    if last is None and configured.cap == settings.max_concurrent_lines:
        sources["max_concurrent_lines"] = "config"  # its initial cap, as the file still says
    if configured.declared == (last or {}):
        if last is None:  # keep the table (none) and the sources found
            return Applied(settings, sources, {})
        return None
    doc = settings.model_dump(mode="json")
    for name in (last or {}).keys() - configured.declared.keys():
        if sources[name] == "config":
            doc[name], sources[name] = _DEFAULTS[name], "default"
    for name, value in configured.declared.items():
        doc[name], sources[name] = value, "config"
    return Applied(RouteSettings.model_validate(doc), sources, configured.declared)


def settings_problem(
    settings: RouteSettings, route_id: str, provider: str, approved_bases: Iterable[str]
) -> tuple[str, str] | None:
    """(field, why) when `settings` cannot serve the route `route_id` of `provider` whose
    metrics may be read from `approved_bases`; None when they can. A `PUT` answers it as a 400,
    the config file fails at start with it."""
    load = settings.server_load
    if load is not None:
        try:
            approve_metrics_url(load.metrics_url, approved_bases)
        except ValueError as err:
            return "server_load.metrics_url", str(err)
    if settings.priority_hint is not None and provider != "vllm":
        return (
            "priority_hint",
            "priority_hint is for vLLM (and other self-hosted OpenAI-compatible) routes; route "
            f"{route_id!r} is provider {provider!r}, which would refuse the field.",
        )
    return None


_DEFAULTS: dict[str, Any] = RouteSettings().model_dump(mode="json")
