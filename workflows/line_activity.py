"""How the batch workflow calls a line's activity: what it is told (`line_input`, pure) and its
timeouts (`run_line`). What the workflow does with the outcome stays in `BatchWorkflow`."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from activities.lines.run_line import LineActivities
    from backfill.batches.batch import Batch
    from backfill.batches.lanes import Lane, Tries
    from backfill.platform.messages import BatchInput, LineInput, LineOutcome

NO_RETRY = RetryPolicy(maximum_attempts=1)
"""Temporal never retries a line: the workflow decides (requeue, back off, give up)."""
LINE_HEARTBEAT_SECONDS = 7.0
"""A line's heartbeat timeout when its batch's input names none (batches created before
`limits.line_heartbeat_timeout_seconds`; it was 10 s then)."""
MAX_LOST_ATTEMPTS = 5
"""A line whose activity was lost this many times (its worker died, the activity crashed) is
given up as `line_lost` on its next run, without being sent again."""


def line_input(
    input: BatchInput, batch: Batch, lane: Lane, position: int, tries: Tries
) -> LineInput:
    """The activity's input for the line at `position` of `lane`, after `tries` earlier runs."""
    lost_too_often = tries.lost >= MAX_LOST_ATTEMPTS
    return LineInput(
        batch_id=batch.id,
        input_file_id=batch.input_file_id,
        endpoint=batch.endpoint,
        route_id=lane.route_id,
        route_index=lane.index,
        position=position,
        final_attempt=tries.retries >= input.max_line_retries,
        give_up_code="line_lost" if lost_too_often else None,
        give_up_message=(
            f"The request's worker was lost {tries.lost} times; it was not retried again."
            if lost_too_often
            else None
        ),
        timeout_seconds=input.line_timeout_seconds,
        priority=lane.priority,
        workspace=input.workspace,
        key_id=input.key_id,
        preemptions=tries.preempted,
    )


async def run_line(input: BatchInput, line: LineInput) -> LineOutcome:
    """Run the line's activity once; an `ActivityError` when it was lost or cancelled."""
    return await workflow.execute_activity_method(
        LineActivities.run_line,
        line,
        start_to_close_timeout=timedelta(seconds=input.line_timeout_seconds + 60),
        heartbeat_timeout=timedelta(
            seconds=input.line_heartbeat_timeout_seconds or LINE_HEARTBEAT_SECONDS
        ),
        retry_policy=NO_RETRY,
    )
