"""A stand-in for a batch on one route: it records each allotment the scheduler sends and
acknowledges it at once (as a batch whose lines end as soon as they must).

Its own module with few imports: the workflow sandbox re-imports a workflow's module."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from backfill.platform.ids import scheduler_workflow_id
    from backfill.platform.messages import Ack, Allotment


@workflow.defn
class SeatBatchWorkflow:
    def __init__(self) -> None:
        self._allotments: list[int] = []
        self._unacked: list[Allotment] = []

    @workflow.run
    async def run(self) -> None:
        while True:
            await workflow.wait_condition(lambda: bool(self._unacked))
            a = self._unacked.pop(0)
            scheduler = workflow.get_external_workflow_handle(scheduler_workflow_id(a.route_id))
            ack = Ack(batch_id=workflow.info().workflow_id, epoch=a.epoch, running=a.lines)
            await scheduler.signal("ack", ack)

    @workflow.signal
    def set_allotment(self, a: Allotment) -> None:
        self._allotments.append(a.lines)
        self._unacked.append(a)

    @workflow.query
    def allotments(self) -> list[int]:
        return self._allotments
