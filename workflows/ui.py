"""What operators see of a batch outside the api: its search attributes and status memo, its
current details in the Temporal UI, and a log line per state change.

The pure parts (the progress, the details' text, the memo's fields) are
`backfill.batches.lifecycle`; this module only hands them to Temporal.
"""

from __future__ import annotations

from temporalio import workflow

from backfill.batches import search_attributes as sa
from backfill.batches.batch import Batch
from backfill.batches.lanes import Lane
from backfill.batches.lifecycle import (
    STATUS_MEMO,
    SUMMARY_MEMO,
    current_details,
    show_progress,
    status_memo,
)
from workflows.patches import STATUS_MEMO as STATUS_MEMO_PATCH


class BatchView:
    """Held by the batch workflow; each method is called with the batch as it now is."""

    def __init__(self, batch: Batch) -> None:
        self._logged_status = shown_state(batch)
        """The state last logged (a continued run does not log its state again)."""

    @staticmethod
    def _indexed() -> bool:
        """Started with backfill's search attributes (by the api): keep them current. A
        namespace without them registered (the time-skipping test server) gets none."""
        return workflow.info().typed_search_attributes.get(sa.WORKSPACE) is not None

    def set_models(self, models: list[str]) -> None:
        """The models the batch's lines name, once validation found them."""
        if self._indexed():
            workflow.upsert_search_attributes([sa.MODELS.value_set(models)])

    def set_status(self, batch: Batch) -> None:
        """After each status change: the status search attribute and the status memo."""
        if self._indexed():
            workflow.upsert_search_attributes([sa.STATUS.value_set(batch.status)])
            if workflow.patched(STATUS_MEMO_PATCH):
                workflow.upsert_memo({STATUS_MEMO: status_memo(batch)})

    def update_summary(self, batch: Batch, lanes: list[Lane], *, ending: bool) -> None:
        """The progress in the extension fields, then the current details."""
        show_progress(batch, lanes, ending=ending)
        self.show_details(batch)

    def show_details(self, batch: Batch) -> None:
        """The UI's current details (no command: a query answers them), and a log line when
        the state changed."""
        summary: str | None = workflow.memo_value(SUMMARY_MEMO, None, type_hint=str)
        workflow.set_current_details(current_details(batch, summary))
        state = shown_state(batch)
        if state != self._logged_status:
            routes = sorted({p.route for p in batch.backfill.routes})
            workflow.logger.info(
                "batch %s (%s): %s -> %s on %s",
                batch.id,
                batch.backfill.workspace,
                self._logged_status,
                state,
                ", ".join(routes) or "no route yet",
                extra={
                    "batch_id": batch.id,
                    "workspace": batch.backfill.workspace,
                    "status": batch.status,
                    "paused": batch.backfill.paused,
                    "routes": routes,
                },
            )
            self._logged_status = state


def shown_state(batch: Batch) -> str:
    """The batch's status as its state-change log lines name it (a pause is a change too)."""
    return f"{batch.status} (paused)" if batch.backfill.paused else batch.status
