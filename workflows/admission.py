"""AdmissionWorkflow: one per workspace, the atomic count of its batches queued or running.

An entity workflow (decision 0020). The `reserve` update decides with
`backfill.tenancy.admission.decide` on the workflow's one thread, so concurrent creates from any
number of api processes are admitted one at a time against an exact count (Temporal's visibility
index lags). Reservations end by `release` (the api could not start the batch) or when a periodic
check finds the batch closed (every reservation is checked; one whose batch Temporal does not know
yet is kept for a grace period); the batch workflow itself knows nothing of this.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from activities.control import ControlActivities
    from backfill.platform.messages import ClosedBatchesInput
    from backfill.tenancy.admission import (
        AdmissionInput,
        AdmissionView,
        ReleaseRequest,
        Reservation,
        ReserveRequest,
        ReserveResult,
        decide,
        due_for_check,
        remember_released,
        to_drop,
    )
    from workflows.patches import ADMISSION_CHECKS_YOUNG_RESERVATIONS


@workflow.defn
class AdmissionWorkflow:
    @workflow.init
    def __init__(self, input: AdmissionInput) -> None:
        self._held: dict[str, Reservation] = {r.batch_id: r for r in input.reservations}
        self._released: list[str] = list(input.released)

    @workflow.run
    async def run(self, input: AdmissionInput) -> None:
        while True:
            if self._held:
                # Woken early by nothing: a release or a new reservation needs no action here.
                await workflow.sleep(timedelta(seconds=input.check_seconds))
                await self._drop_closed(input.grace_seconds)
            else:
                await workflow.wait_condition(
                    lambda: bool(self._held) or workflow.info().is_continue_as_new_suggested()
                )
            if workflow.info().is_continue_as_new_suggested():
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(
                    input.model_copy(
                        update={
                            "reservations": list(self._held.values()),
                            "released": self._released,
                        }
                    )
                )

    @workflow.update
    def reserve(self, req: ReserveRequest) -> ReserveResult:
        result = decide(list(self._held.values()), req, frozenset(self._released))
        if result.accepted and req.batch_id not in self._held:
            self._held[req.batch_id] = Reservation(
                batch_id=req.batch_id,
                input_file_id=req.input_file_id,
                input_bytes=req.input_bytes,
                lines=req.lines,
                reserved_at=workflow.now().timestamp(),
            )
        return result

    @workflow.signal
    def release(self, req: ReleaseRequest) -> None:
        self._held.pop(req.batch_id, None)
        self._released = remember_released(self._released, req.batch_id)

    @workflow.query
    def holdings(self) -> AdmissionView:
        return AdmissionView(reservations=list(self._held.values()))

    async def _drop_closed(self, grace_seconds: float) -> None:
        held = list(self._held.values())
        now = workflow.now().timestamp()
        ids = due_for_check(held, now, grace_seconds)
        if len(ids) < len(held) and workflow.patched(ADMISSION_CHECKS_YOUNG_RESERVATIONS):
            ids = [r.batch_id for r in held]
        if not ids:
            return
        out = await workflow.execute_activity_method(
            ControlActivities.find_closed_batches,
            ClosedBatchesInput(batch_ids=ids),
            start_to_close_timeout=timedelta(seconds=30),
        )
        for batch_id in to_drop(held, out.closed, out.missing, now, grace_seconds):
            self._held.pop(batch_id, None)
