"""BatchWorkflow: one OpenAI batch, from validation to its output files (workflow id = batch id).

Orchestration only. Decisions are pure and unit-tested elsewhere: what may start and what to tell
a scheduler in `backfill.batches.lanes`, statuses, progress and deadlines in
`backfill.batches.lifecycle`, the run's length in `run_length`. Helpers: `CancelRequests` (a
Temporal cancellation request means the `cancel` signal), `SchedulerLink` (demand, acks and back-off
reports to the routes' schedulers), `BatchView` (search attributes, memo, UI details), `Alarm` (one
timer for the next deadline), `line_activity` (how a line's activity is called). Every
`workflow.patched` id and its history: `patches`. Every piece of I/O is an activity.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, is_cancelled_exception
from temporalio.exceptions import TimeoutError as ActivityTimeout

with workflow.unsafe.imports_passed_through():
    from activities.finalizing import FinalizeActivities
    from activities.validation import ValidationActivities
    from backfill.batches.batch import Batch, BatchErrors, RequestCounts, Usage
    from backfill.batches.lanes import Lane, Tries
    from backfill.batches.lifecycle import (
        check_expiry,
        end_status,
        initial_batch,
        may_cancel,
        next_wakeup,
        show_done,
        tally_line,
        transition,
    )
    from backfill.batches.storage_waits import (
        INITIAL_INTERVAL_SECONDS,
        MAX_INTERVAL_SECONDS,
        store_failure,
        store_wait_seconds,
    )
    from backfill.platform.messages import (
        Allotment,
        BatchInput,
        BatchState,
        EndReason,
        FinalizeInput,
        PauseRequest,
        ValidateInput,
    )
    from workflows import line_activity, patches, run_length, webhooks
    from workflows.alarm import Alarm
    from workflows.cancellation import CancelRequests
    from workflows.scheduler_link import SchedulerLink
    from workflows.ui import BatchView


@workflow.defn
class BatchWorkflow:
    @workflow.init
    def __init__(self, input: BatchInput) -> None:
        self._input = input
        self._s = input.state or BatchState(batch=initial_batch(input))
        self._dirty = False
        self._lines_this_run = 0
        self._draining = False
        self._tasks: set[asyncio.Future[None]] = set()
        self._alarm = Alarm(self._wake)
        self._view = BatchView(self._s.batch)
        self._cancellation = CancelRequests(self.cancel, lambda: may_cancel(self._b))
        self._schedulers = SchedulerLink(input.batch_id, input.workspace, self._cancellation)

    # ---- run ----
    @workflow.run
    async def run(self, input: BatchInput) -> Batch:
        if input.state is None:
            await self._validate(input)
            if self._b.status == "failed":
                self._view.show_details(self._b)
                await self._announce()
                await self._cancellation.wait(workflow.all_handlers_finished)
                return self._b
        while True:
            # Cleared before any await: a signal that lands while we report demand wakes the
            # next wait at once instead of being lost.
            self._dirty = False
            self._cancellation.check()
            check_expiry(self._b, self._lanes, _now())
            ending = self._ending
            running = sum(lane.running for lane in self._lanes)
            if running == 0 and (ending or all(lane.done for lane in self._lanes)):
                break
            if self._draining and running == 0:
                await self._report_demands()
                await self._cancellation.wait(workflow.all_handlers_finished)
                workflow.continue_as_new(input.model_copy(update={"state": self._s}))
            if not ending and not self._b.backfill.paused and not self._draining:
                self._start_lines()
            try:
                await self._report_demands()
                self._update_summary()
                self._set_alarm()
                await workflow.wait_condition(lambda: self._dirty)
            except asyncio.CancelledError:
                # Cancelled from the Temporal UI or `temporal workflow cancel`: the same as the
                # `cancel` signal, so running lines finish and the partial results are kept.
                self._cancellation.requested()
        await self._finish()
        return self._b

    def _wake(self) -> None:
        self._dirty = True

    @property
    def _b(self) -> Batch:
        return self._s.batch

    @property
    def _lanes(self) -> list[Lane]:
        return self._s.lanes

    @property
    def _expired(self) -> bool:
        return self._b.expired_at is not None

    @property
    def _ending(self) -> bool:
        return self._expired or self._b.status == "cancelling"

    @property
    def _quiet(self) -> bool:
        """No demand worth keeping alive: paused, ending or draining."""
        return self._b.backfill.paused or self._ending or self._draining

    async def _validate(self, input: BatchInput) -> None:
        waits = workflow.patched(patches.STORE_OUTAGE_WAITS)
        try:
            out = await self._cancellation.through(
                workflow.start_activity_method(
                    ValidationActivities.validate_input,
                    ValidateInput(
                        batch_id=input.batch_id,
                        input_file_id=input.input_file_id,
                        endpoint=input.endpoint,
                        allowed_models=input.allowed_models,
                    ),
                    start_to_close_timeout=timedelta(minutes=30),
                    heartbeat_timeout=timedelta(seconds=60),
                    **self._store_retries(waits, old_attempts=3),
                )
            )
        except ActivityError as err:
            if not waits or is_cancelled_exception(err):
                raise
            self._fail_on_store("validation", err)
            return
        now = _now()
        if out.errors:  # rejected input fails the batch, even if a cancel came meanwhile
            self._b.errors = BatchErrors(data=out.errors)
            transition(self._b, "failed", now)
            self._view.set_status(self._b)
            return
        self._s.lanes = [Lane.from_assignment(r) for r in out.routes]
        self._b.request_counts = RequestCounts(total=out.total)
        self._b.model = out.models[0] if len(out.models) == 1 else None
        if self._b.status == "cancelling":  # cancelled while validating: nothing will run
            for lane in self._lanes:
                lane.stop()
            return
        transition(self._b, "in_progress", now)
        self._view.set_models(out.models)
        self._view.set_status(self._b)

    def _set_alarm(self) -> None:
        """Wake the main loop at the next deadline (see `patches.ALARMS_ON_TIME` for the two
        rules; the patch is asked only where they differ)."""

        def wakeup(backoffs_when_quiet: bool) -> float | None:
            return next_wakeup(
                self._lanes,
                expires_at=self._b.expires_at or 0,
                ending=self._ending,
                quiet=self._quiet,
                backoffs_when_quiet=backoffs_when_quiet,
            )

        before, after = wakeup(True), wakeup(False)
        passed = after is not None and after <= workflow.now().timestamp()
        if (after != before or passed) and workflow.patched(patches.ALARMS_ON_TIME):
            self._alarm.set(after, ring_if_past=True)
        else:
            self._alarm.set(before)

    # ---- lines ----
    def _start_lines(self) -> None:
        now_s = workflow.now().timestamp()
        for lane in self._lanes:
            if lane.backoff_until is not None and lane.backoff_until <= now_s:
                lane.backoff_until = None
            while lane.can_start(now_s):
                position, tries = lane.take()
                task = asyncio.ensure_future(self._run_line(lane, position, tries))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _run_line(self, lane: Lane, position: int, tries: Tries) -> None:
        line = line_activity.line_input(self._input, self._b, lane, position, tries)
        started = workflow.now().timestamp()
        try:
            outcome = await line_activity.run_line(self._input, line)
        except ActivityError as err:
            if self._cancellation.cancelled_line(err):
                workflow.logger.info("line %s/%s cancelled", lane.route_id, position)
                self.cancel()
                return
            # The worker running it died (heartbeat timeout) or the activity crashed: the line
            # goes back to the front of the queue; the result store commits it at most once.
            workflow.logger.warning("line %s/%s lost: %s", lane.route_id, position, err.cause)
            lane.requeue(position, tries.model_copy(update={"lost": tries.lost + 1}))
        else:
            lane.reprefill_tokens += max(0, outcome.reprefill_tokens)  # a count, no command
            if outcome.preempted and workflow.patched(patches.PREEMPTED_LINE_REQUEUED):
                if outcome.held and workflow.patched(patches.HELD_LINE_REQUEUED):
                    # It waited at the worker's door, never sent: first in the queue again
                    # with nothing counted (waiting is not a try).
                    lane.requeue(position, tries)
                else:
                    # Live traffic took its seat back: first in the queue again, no back-off,
                    # no retry counted (`Tries.preempted` bounds it: the worker lets it finish
                    # later); the lane counts it and the tokens it wasted (`backfill.routes[]`).
                    lane.requeue_preempted(position, tries, outcome.wasted_tokens)
            elif outcome.retry:
                lane.requeue(position, tries.model_copy(update={"retries": tries.retries + 1}))
                # Retry-After holds this batch's lane too, not only (once the scheduler has
                # the signal) the route: no next line before it, whatever the signal's delay.
                honoured = workflow.patched(patches.LANE_HONOURS_RETRY_AFTER)
                lane.back_off(workflow.now().timestamp(), outcome.retry_after if honoured else None)
                if workflow.patched(patches.ROUTE_WIDE_BACKOFF):
                    await self._schedulers.rate_limited(lane, outcome.retry_after)
            else:
                lane.finish()
                lane.time_line(workflow.now().timestamp() - started)
                self._lines_this_run += 1
                tally_line(self._b, outcome)  # progress only: see `_finish`
        finally:
            lane.running -= 1
            if not self._draining and self._run_is_full():
                self._draining = True
            self._dirty = True

    def _run_is_full(self) -> bool:
        """Time to drain and continue as new (decided in `run_length`)."""
        if not workflow.patched(patches.CONTINUE_AS_NEW_BY_HISTORY):
            # A run from before the patch, replayed: its rule exactly (the safety net's drain
            # could come earlier than that and change the commands it recorded).
            return (
                self._lines_this_run >= patches.LINES_PER_RUN
                or workflow.info().is_continue_as_new_suggested()
            )
        info = workflow.info()
        return run_length.run_is_full(
            suggested=info.is_continue_as_new_suggested(),
            events=info.get_current_history_length(),
            size_bytes=info.get_current_history_size(),
        )

    # ---- the routes' schedulers (workflows/scheduler_link.py) ----
    async def _report_demands(self) -> None:
        # Asked per lane, as the batch may change while a report is sent.
        halt = self._draining or self._b.backfill.paused or self._ending
        await self._schedulers.report_demands(
            self._lanes,
            halt=lambda: halt and not self._draining,
            quiet=lambda: self._quiet,
            expires_at=self._b.expires_at,
        )

    @workflow.signal
    def set_allotment(self, a: Allotment) -> None:
        for lane in self._lanes:
            if lane.route_id == a.route_id:
                lane.set_allotment(a.epoch, a.lines, a.priority)
        self._dirty = True

    # ---- operator controls ----
    @workflow.signal
    def pause(self, req: PauseRequest | None = None) -> None:
        ext = self._b.backfill
        if self._b.status not in ("in_progress", "validating") or ext.paused:
            return
        ext.paused = True
        ext.paused_by = (req or PauseRequest()).by
        self._update_summary()
        self._dirty = True

    @workflow.signal
    def resume(self) -> None:
        ext = self._b.backfill
        if not ext.paused:
            return
        ext.paused = False
        ext.paused_by = None
        self._update_summary()
        self._dirty = True

    @workflow.signal
    def cancel(self) -> None:
        """Operators: `temporal workflow signal --workflow-id <batch id> --name cancel`."""
        if may_cancel(self._b):
            transition(self._b, "cancelling", _now())
            for lane in self._lanes:
                lane.stop()
            self._view.set_status(self._b)
            self._update_summary()
            self._dirty = True

    @workflow.update
    def cancel_now(self) -> Batch:
        """The api's cancel: same as the signal, answering with the batch as it now is."""
        self.cancel()
        return self._b

    @workflow.query
    def describe(self) -> Batch:
        return self._b

    def _update_summary(self) -> None:
        self._view.update_summary(self._b, self._lanes, ending=self._ending)

    # ---- the end ----
    async def _finish(self) -> None:
        await self._report_demands()  # leave every scheduler (wanted 0)
        self._cancellation.check()
        reason: EndReason
        if self._b.status == "cancelling":
            reason = "cancelled"
        elif self._expired:
            reason = "expired"
        else:
            reason = "completed"
            transition(self._b, "finalizing", _now())
            self._view.set_status(self._b)
        waits = workflow.patched(patches.STORE_OUTAGE_WAITS)
        try:
            out = await self._cancellation.through(
                workflow.start_activity_method(
                    FinalizeActivities.finalize_batch,
                    FinalizeInput(
                        batch_id=self._b.id,
                        workspace=self._input.workspace,
                        input_file_id=self._b.input_file_id,
                        reason=reason,
                        output_expires_after_seconds=self._input.output_expires_after_seconds,
                    ),
                    start_to_close_timeout=timedelta(hours=1),
                    heartbeat_timeout=timedelta(seconds=60),
                    **self._store_retries(waits, old_attempts=5),
                )
            )
        except ActivityError as err:
            if not waits or is_cancelled_exception(err):
                raise
            self._fail_on_store("finalizing", err)
            self._update_summary()
            self._view.show_details(self._b)
            await self._announce()
            await self._cancellation.wait(workflow.all_handlers_finished)
            return
        b = self._b
        b.output_file_id = out.output_file_id
        b.error_file_id = out.error_file_id
        # The committed records are the truth (a line committed by a worker that died is
        # counted, once; a line cancelled with the workflow is counted as what it committed):
        # finalizing's counts and usage replace the running tallies by design.
        b.request_counts = RequestCounts(
            total=out.total, completed=out.completed, failed=out.failed
        )
        b.usage = Usage()
        b.usage.add(out.usage)
        transition(b, end_status(reason), _now())
        self._update_summary()
        show_done(b)
        self._view.show_details(b)
        self._view.set_status(b)
        await self._announce()
        await self._cancellation.wait(workflow.all_handlers_finished)

    # ---- the file store's outages (backfill.batches.storage_waits, docs/decisions/0047) ----
    def _store_retries(self, waits: bool, old_attempts: int) -> dict[str, Any]:
        """The retry options of validation and finalizing: until the batch's deadline, at most
        `MAX_INTERVAL_SECONDS` apart (`patches.STORE_OUTAGE_WAITS`); else the old attempts."""
        if not waits:
            return {"retry_policy": RetryPolicy(maximum_attempts=old_attempts)}
        wait_s = store_wait_seconds(_now(), self._b.expires_at)
        return {
            "schedule_to_close_timeout": timedelta(seconds=wait_s),
            "retry_policy": RetryPolicy(
                initial_interval=timedelta(seconds=INITIAL_INTERVAL_SECONDS),
                backoff_coefficient=2.0,
                maximum_interval=timedelta(seconds=MAX_INTERVAL_SECONDS),
                maximum_attempts=0,
            ),
        }

    def _fail_on_store(self, step: str, err: ActivityError) -> None:
        """Validation or finalizing failed for good: the batch ends `failed`, saying why."""
        cause = err.cause
        error_type = cause.type if isinstance(cause, ApplicationError) else None
        waited_out = isinstance(cause, ActivityTimeout)
        workflow.logger.warning("%s of %s failed for good: %s", step, self._b.id, cause)
        self._b.errors = BatchErrors(
            data=[store_failure(step, waited_out=waited_out, error_type=error_type)]
        )
        transition(self._b, "failed", _now())
        self._view.set_status(self._b)

    async def _announce(self) -> None:
        """The terminal status's webhook event, delivered apart from the batch
        (`webhooks.announce`); runs from before `patches.WEBHOOK_EVENTS` announce nothing."""
        if workflow.patched(patches.WEBHOOK_EVENTS):
            await self._cancellation.through(
                asyncio.ensure_future(webhooks.announce(self._b, self._input.workspace))
            )


def _now() -> int:
    return int(workflow.now().timestamp())
