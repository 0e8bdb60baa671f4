"""A stand-in for a batch that holds a route's only slot for days (never acknowledges).

Its own module with few imports: the workflow sandbox re-imports a workflow's module."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from backfill.platform.messages import Allotment


@workflow.defn
class SlotHolderWorkflow:
    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: False)

    @workflow.signal
    def set_allotment(self, a: Allotment) -> None:
        pass
