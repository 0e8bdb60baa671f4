"""RetentionWorkflow: one cleanup pass, started by a Temporal Schedule (see
`worker.retention.ensure_schedule`). The schedule, not a loop in a workflow, keeps time: each
pass is a short workflow with a short history."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from activities.retention import RetentionActivities
    from backfill.platform.messages import CleanupInput, CleanupOutput


@workflow.defn
class RetentionWorkflow:
    @workflow.run
    async def run(self, input: CleanupInput) -> CleanupOutput:
        return await workflow.execute_activity_method(
            RetentionActivities.delete_expired_files,
            input,
            start_to_close_timeout=timedelta(minutes=30),
            retry_policy=RetryPolicy(maximum_attempts=3),
        )
