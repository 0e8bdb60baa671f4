"""A Temporal cancellation request means what the batch's `cancel` signal means, wherever the
batch workflow's main task is (docs/decisions/0008).

Two ways to cancel a batch, told apart by how they arrive:

- the api's `cancel_now` update and the operators' `cancel` signal run a handler, which calls
  `BatchWorkflow.cancel` directly; the main task is not disturbed;
- a cancellation request (the Temporal UI's Cancel, `temporal workflow cancel`) cancels whatever
  the main task awaits at that moment: the await raises `asyncio.CancelledError`, or, when the
  main task awaits a signal to another workflow, the SDK lets the signal complete and the request
  shows only in `workflow.cancellation_reason()`. A line activity is cancelled with the workflow.

`CancelRequests` turns the second into the first: every await of the main task goes through
`through` (activities) or `wait` (conditions), which on a request cancel the batch and keep
waiting, so the activity's result (the line lists, the demand, the files) is not lost. Runs from
before `patches.CANCEL_REQUEST_KEEPS_RESULTS` let the request cancel the await, as they did.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from temporalio import workflow
from temporalio.exceptions import ActivityError, is_cancelled_exception

from workflows.patches import CANCEL_REQUEST_KEEPS_RESULTS

T = TypeVar("T")


class CancelRequests:
    def __init__(self, cancel: Callable[[], None], may_cancel: Callable[[], bool]) -> None:
        self._cancel = cancel
        """The batch's `cancel` (a no-op once too late)."""
        self._may_cancel = may_cancel
        """Whether a cancel would still take effect (`backfill.batches.lifecycle.may_cancel`)."""

    def requested(self) -> None:
        """A cancellation request landed: cancel the batch as the `cancel` signal does."""
        workflow.logger.info("workflow cancellation requested: cancelling the batch")
        self._cancel()

    async def through(self, operation: asyncio.Future[T]) -> T:
        """The result of an activity the main task awaits, even if a cancellation request lands
        meanwhile: the batch is cancelled and the activity runs to its end."""
        while True:
            try:
                return await asyncio.shield(operation)
            except asyncio.CancelledError:
                if not self._keep_going():
                    operation.cancel()  # what a run from before the patch did
                    return await operation

    async def wait(self, condition: Callable[[], bool]) -> None:
        """`workflow.wait_condition`, through cancellation requests (see `through`)."""
        while True:
            try:
                await workflow.wait_condition(condition)
                return
            except asyncio.CancelledError:
                if not self._keep_going():
                    raise

    def _keep_going(self) -> bool:
        if not workflow.patched(CANCEL_REQUEST_KEEPS_RESULTS):
            return False
        self.requested()
        return True

    def check(self) -> None:
        """A request can land while the main task awaits a signal to another workflow: the SDK
        then lets the signal complete and the request shows only here."""
        if (
            workflow.cancellation_reason() is not None
            and self._may_cancel()
            and workflow.patched(CANCEL_REQUEST_KEEPS_RESULTS)
        ):
            self.requested()

    @staticmethod
    def cancelled_line(err: ActivityError) -> bool:
        """A line activity that ended cancelled because the workflow was: not lost, not run
        again (the finalizer reads the store: completed if it committed a record, else
        cancelled). Runs from before the patch counted it lost."""
        return (
            is_cancelled_exception(err)
            and workflow.cancellation_reason() is not None
            and workflow.patched(CANCEL_REQUEST_KEEPS_RESULTS)
        )
