"""The validation activity: stream the batch's pinned input once through `input_rules` and,
when it is valid, write the line index the line activities read by offset."""

from __future__ import annotations

from temporalio import activity

from activities.heartbeat import heartbeating
from activities.store_waits import through_outages
from backfill.batches.input_rules import validate_input as validate_lines
from backfill.batches.lanes import RouteAssignment
from backfill.batches.prefix_order import reorder
from backfill.files import RouteLines, Store
from backfill.platform.config import Settings
from backfill.platform.messages import ValidateInput, ValidateOutput


class ValidationActivities:
    def __init__(self, settings: Settings, store: Store) -> None:
        self.settings = settings
        self.store = store

    @activity.defn
    async def validate_input(self, input: ValidateInput) -> ValidateOutput:
        async with heartbeating():
            return await through_outages(
                "validation", input.batch_id, lambda: self._validate(input)
            )

    def _validate(self, input: ValidateInput) -> ValidateOutput:
        allowed = frozenset(input.allowed_models) if input.allowed_models is not None else None
        with self.store.open_input(input.batch_id, input.input_file_id) as f:
            out = validate_lines(
                f,
                batch_id=input.batch_id,
                endpoint=input.endpoint,
                settings=self.settings,
                allowed_models=allowed,
            )
        if out.errors:
            return ValidateOutput(errors=out.errors)
        # The order each route's lines start in (the route's line list); the output keeps the
        # input's order whatever this is.
        if len(out.prefix_keys):
            out.route_line_numbers = [reorder(n, out.prefix_keys) for n in out.route_line_numbers]
        self.store.write_index(
            input.batch_id, out.offsets, out.lengths, out.routes, out.route_line_numbers
        )
        return ValidateOutput(
            total=len(out.offsets),
            routes=[_assignment(i, r) for i, r in enumerate(out.routes)],
            models=out.models,
        )


def _assignment(index: int, r: RouteLines) -> RouteAssignment:
    return RouteAssignment(index=index, route_id=r.route_id, model=r.model, total=r.count)
