"""The maintenance hold: no new batch line starts on the route between two instants set ahead
(a GPU node's driver upgrade, a model server's redeploy or restart, a launch that needs every
seat), and the route goes on by itself when the hold ends.

Pure (pydantic only, no I/O, no clock): the decision reads the setting and workflow time, and
says when it changes (`wake_at`), so the route scheduler sleeps on a timer until the hold starts
and until it ends, never polls. Like every gate it stops only new lines: lines running when the
hold starts run on. To have the route drained when the work starts, set `start` earlier by the
longest a line runs (the line timeout at most). A hold whose `end` has passed is over: the gate
stays open until the setting is changed.
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import AwareDatetime, BaseModel, ConfigDict, model_validator

from backfill.routes.gates.base import OPEN, FormField, GateAnswer, GateContext, GateEntry
from backfill.routes.reasons import WaitReason

__all__ = ["ENTRY", "MAX_HOLD", "MaintenanceHold", "decide"]

MAX_HOLD = timedelta(days=31)
"""The longest hold: a longer pause of a route is a change of its settings, not maintenance."""


class MaintenanceHold(BaseModel):
    """The settings document's `maintenance`: no new batch line from `start` until `end`."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    start: AwareDatetime
    """When the hold starts: an ISO 8601 date and time with its UTC offset (e.g.
    `2026-12-05T01:30:00Z`, `2026-12-05T02:30:00+01:00`)."""
    end: AwareDatetime
    """When it ends and lines start again: after `start`, at most 31 days after it."""

    @model_validator(mode="after")
    def _a_bounded_span(self) -> MaintenanceHold:
        if self.end <= self.start:
            raise ValueError("`end` must be after `start`")
        if self.end - self.start > MAX_HOLD:
            raise ValueError(f"a hold lasts at most {MAX_HOLD.days} days")
        return self


def decide(hold: MaintenanceHold, ctx: GateContext) -> GateAnswer:
    """Closed from `start` until `end`; open before (it closes at `start`) and after."""
    start, end = hold.start.timestamp(), hold.end.timestamp()
    if ctx.at < start:
        return GateAnswer(True, wake_at=start)
    if ctx.at < end:
        detail = f"until {hold.end.isoformat()}"
        return GateAnswer(False, WaitReason.MAINTENANCE, detail=detail, wake_at=end)
    return OPEN


ENTRY = GateEntry(
    name="maintenance",
    label="Maintenance hold",
    model=MaintenanceHold,
    decide=decide,
    doc='"Maintenance hold": no new line starts from `start` until `end` (ISO 8601 with a UTC '
    "offset; at most 31 days); running lines finish (null: none).",
    off="none",
    summary=lambda h: f"{h.start.isoformat()} – {h.end.isoformat()}",
    form=(
        FormField("start", "Start (ISO 8601 with offset; blank: none)", numeric=False),
        FormField("end", "End (ISO 8601 with offset)", numeric=False),
    ),
)
