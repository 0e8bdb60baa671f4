"""A route's status: what its scheduler's `status` query answers (`SchedulerStatus`) and the
fields it shares with the management API's route status (`RouteState`, extended by
`api.schemas.SchedulingStatus`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from backfill.routes.gates.server_load import LoadReading
from backfill.routes.settings import RouteSettings, SettingSource


def _whole_seconds(value: Any) -> Any:
    """A time in unix seconds, cut to the second (the back-off gate keeps fractions, and so did
    the status of a worker of an earlier version)."""
    return int(value) if isinstance(value, float) else value


WholeSeconds = Annotated[int, BeforeValidator(_whole_seconds)]
"""Unix seconds, a whole number, as the api answers every time."""


class BatchStatusEntry(BaseModel):
    """One batch as the route's scheduler sees it (in its `status` query and the management
    API's `status.batches`)."""

    model_config = ConfigDict(
        json_schema_serialization_defaults_required=True, use_attribute_docstrings=True
    )

    batch_id: str
    workspace: str
    wanted: int
    """Lines the batch could run now on this route."""
    allotment: int
    """Lines it may run (the scheduler's last decision)."""
    held: int
    """Slots counted as used by it (the old allotment until a shrink is acknowledged)."""
    queue_position: int | None = None
    reason: str | None = None
    """Why its lines wait, when they do."""


class RouteState(BaseModel):
    """What a route's scheduler says of the route now: the fields its `status` query
    (`SchedulerStatus`) and the management API's route status (`api.schemas.SchedulingStatus`)
    share, declared once (the gates' fields among them: each gate's `status` fills its own)."""

    model_config = ConfigDict(
        json_schema_serialization_defaults_required=True, use_attribute_docstrings=True
    )

    queued_lines: int
    """Lines wanted beyond their allotments."""
    limit: int
    """Batch lines the route allows now: "Batch lines at once", or a gate's or the reopen ramp's
    lower limit."""
    ramping_to: int | None = None
    """While the reopen ramp holds `limit` below what the gates allow: that (null: not
    ramping)."""
    live_in_flight: int = 0
    """Live requests in flight on the route, summed over every api process reporting."""
    seats_held_back: int = 0
    """Seats the workers hold back from batch lines for preemptive yield's live TTFT target,
    beyond `keep_free` (the allotment leaves them out)."""
    state: Literal["open", "paused"] = "open"
    """`paused`: a gate holds every new line back; running lines finish."""
    reason: str | None = None
    """Why lines are held back (one of the documented reasons), or null."""
    reason_detail: str | None = None
    """More about the reason (e.g. why the server's metrics could not be read)."""
    backoff_until: WholeSeconds | None = None
    """While rate limited: when the back-off ends (unix seconds)."""
    server_load: LoadReading | None = None
    """The reading of the model server's `/metrics` the server load signal last judged (null
    while the signal is off, or before its first reading). The scheduler's watcher reads every
    few seconds while lines wait and tells the scheduler only when its verdict changes, so
    `read_at` says how old these figures are."""
    batches: list[BatchStatusEntry]


class SchedulerStatus(RouteState):
    """The scheduler's `status` query answer."""

    route_id: str
    settings: RouteSettings
    sources: dict[str, SettingSource] = Field(default_factory=dict)
    """Where each setting came from: `config`, `admin_api` or `default`."""
    allotted: int
    """Sum of allotments: lines batches may run now."""
    held: int
    """Slots counted as used (≥ allotted while shrinks are unacknowledged)."""
