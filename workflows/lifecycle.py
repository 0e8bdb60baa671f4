"""A batch's lifecycle, pure: status transitions with their timestamps, the progress shown in
the extension fields, and when the workflow must next wake up.

No temporalio import: `BatchWorkflow` passes `workflow.now()` in and acts on the answers.
"""

from __future__ import annotations

from backfill.batches import COMPLETION_WINDOWS, BackfillExtension, Batch
from workflows.messages import BatchInput


def initial_batch(input: BatchInput) -> Batch:
    """The Batch object as created, before validation (also what the api answers)."""
    hours = COMPLETION_WINDOWS[input.completion_window]
    return Batch(
        id=input.batch_id,
        endpoint=input.endpoint,
        input_file_id=input.input_file_id,
        completion_window=input.completion_window,
        status="validating",
        created_at=input.created_at,
        expires_at=input.created_at + hours * 3600,
        metadata=input.metadata,
        backfill=BackfillExtension(workspace=input.workspace),
    )
