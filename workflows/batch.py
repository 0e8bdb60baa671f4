"""BatchWorkflow: one OpenAI batch, from validation to its output files (workflow id = batch id).

Orchestration only: the per-route bookkeeping (what may start, what to tell the scheduler) lives in
`backfill.lanes`, pure and unit-tested; every piece of I/O is an activity.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from typing import TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, is_cancelled_exception

with workflow.unsafe.imports_passed_through():
    from activities.control import ControlActivities
    from activities.finalizing import FinalizeActivities
    from activities.lines import LineActivities
    from activities.validation import ValidationActivities
    from backfill import refs
    from backfill import search_attributes as sa
    from backfill.batches import (
        Batch,
        BatchErrors,
        RequestCounts,
        Usage,
    )
    from backfill.lanes import Lane, Tries, demand_to_report
    from backfill.lifecycle import (
        STATUS_MEMO,
        SUMMARY_MEMO,
        check_expiry,
        current_details,
        end_status,
        initial_batch,
        keepalive_due,
        may_cancel,
        next_wakeup,
        show_done,
        show_progress,
        status_memo,
        transition,
    )
    from backfill.messages import (
        Ack,
        Allotment,
        BatchInput,
        BatchState,
        DemandInput,
        EndReason,
        FinalizeInput,
        LineInput,
        LineOutcome,
        PauseRequest,
        RateLimited,
        ValidateInput,
    )
    from workflows import run_length
    from workflows.alarm import Alarm

NO_RETRY = RetryPolicy(maximum_attempts=1)
LINE_HEARTBEAT_SECONDS = 7.0
"""A line's heartbeat timeout when its batch's input names none (batches created before
`limits.line_heartbeat_timeout_seconds`; it was 10 s then)."""
MAX_LOST_ATTEMPTS = 5
LINES_PER_RUN = 2_000
"""Runs from before `CONTINUE_AS_NEW_BY_HISTORY` also continued as new after this many lines
finished in one run; kept only so they replay."""
CONTINUE_AS_NEW_BY_HISTORY = "continue-as-new-by-history"
"""Patch: a run continues as new when Temporal suggests it or its history reaches
`run_length`'s bounds, no longer after a fixed `LINES_PER_RUN` lines, so a batch has as few runs
as the server's thresholds allow. Runs from before it drained at `LINES_PER_RUN` lines."""
CANCEL_REQUEST_KEEPS_RESULTS = "cancel-request-keeps-results"
"""Patch: a workflow cancellation request that lands while the main task awaits an activity or a
signal cancels the batch like the `cancel` signal. Runs from before it closed as cancelled,
without files, and must replay so (docs/decisions/0008)."""
ROUTE_WIDE_BACKOFF = "route-wide-backoff"
"""Patch: a rate-limited line also signals the route's scheduler (added after batches were
running), so every batch on the route backs off."""
LANE_HONOURS_RETRY_AFTER = "lane-honours-retry-after"
"""Patch: a Retry-After also holds the batch's own lane that long (before, the lane waited
1 s doubling and only the scheduler's route-wide back-off honoured Retry-After, so a next line
could start before the scheduler's signal arrived)."""
ALARMS_ON_TIME = "alarms-on-time"
"""Patch: the batch's alarm never rings for a deadline already passed. Before, (1) a keep-alive's
deadline was compared in whole seconds (`_now()`), so for up to a second after it the alarm,
already past, rang again on a one-millisecond timer: hundreds of timers per hourly keep-alive
while a batch waited for a slot (a 36-hour wait for a time window grew a 3-line batch to 21,614
events); (2) a paused, ending or draining batch kept a passed back-off as its next deadline and
rang for it every millisecond until it resumed or ended; (3) a deadline passed during the loop's
own awaits cost a one-millisecond timer. Now keep-alives compare exact times, back-offs count
only while lines may start, and a passed deadline rings in the same activation."""
STATUS_MEMO_PATCH = "status-memo"
"""Patch: each status change also upserts the batch's compact status into its memo
(`STATUS_MEMO`), so the api can answer a retrieve without a worker. A new command: runs from
before it must replay without it."""

T = TypeVar("T")


@workflow.defn
class BatchWorkflow:
    @workflow.init
    def __init__(self, input: BatchInput) -> None:
        self._input: BatchInput | None = input
        self._s: BatchState | None = input.state or BatchState(batch=initial_batch(input))
        self._dirty = False
        self._lines_this_run = 0
        self._draining = False
        self._tasks: set[asyncio.Future[None]] = set()
        self._alarm = Alarm(self._wake)
        self._logged_status: str = _shown_state(self._s.batch)
        """The status last logged (a continued run does not log its status again)."""

    # ---- run ----
    @workflow.run
    async def run(self, input: BatchInput) -> Batch:
        if input.state is None:
            await self._validate(input)
            if self._b.status == "failed":
                self._show_details()
                await self._wait(workflow.all_handlers_finished)
                return self._b
        while True:
            # Cleared before any await: a signal that lands while we report demand wakes the
            # next wait at once instead of being lost.
            self._dirty = False
            self._check_cancel_request()
            check_expiry(self._b, self._lanes, _now())
            ending = self._b.status in ("cancelling",) or self._expired
            running = sum(lane.running for lane in self._lanes)
            if running == 0 and (ending or all(lane.done for lane in self._lanes)):
                break
            if self._draining and running == 0:
                await self._report_demands()
                await self._wait(workflow.all_handlers_finished)
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
                workflow.logger.info("workflow cancellation requested: cancelling the batch")
                self.cancel()
        await self._finish()
        return self._b

    # ---- cancellation requests (the Temporal UI's Cancel, `temporal workflow cancel`) ----
    async def _through(self, operation: asyncio.Future[T]) -> T:
        """The result of an activity the main task awaits, even if a workflow cancellation
        request lands meanwhile: the batch is cancelled like the `cancel` signal and the activity
        runs to its end (its result matters: the line index, the demand, the files)."""
        while True:
            try:
                return await asyncio.shield(operation)
            except asyncio.CancelledError:
                if not self._keep_going_after_cancel_request():
                    operation.cancel()  # what a run from before the patch did
                    return await operation

    async def _wait(self, condition: Callable[[], bool]) -> None:
        """`workflow.wait_condition`, through cancellation requests (see `_through`)."""
        while True:
            try:
                await workflow.wait_condition(condition)
                return
            except asyncio.CancelledError:
                if not self._keep_going_after_cancel_request():
                    raise

    def _keep_going_after_cancel_request(self) -> bool:
        if not workflow.patched(CANCEL_REQUEST_KEEPS_RESULTS):
            return False
        workflow.logger.info("workflow cancellation requested: cancelling the batch")
        self.cancel()
        return True

    def _check_cancel_request(self) -> None:
        """A request can land while the main task awaits a signal to another workflow: the SDK
        then lets the signal complete and the request shows only here."""
        if (
            workflow.cancellation_reason() is not None
            and may_cancel(self._b)
            and workflow.patched(CANCEL_REQUEST_KEEPS_RESULTS)
        ):
            workflow.logger.info("workflow cancellation requested: cancelling the batch")
            self.cancel()

    def _wake(self) -> None:
        self._dirty = True

    @property
    def _b(self) -> Batch:
        assert self._s is not None
        return self._s.batch

    @property
    def _lanes(self) -> list[Lane]:
        assert self._s is not None
        return self._s.lanes

    @property
    def _expired(self) -> bool:
        return self._b.expired_at is not None

    async def _validate(self, input: BatchInput) -> None:
        out = await self._through(
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
                retry_policy=RetryPolicy(maximum_attempts=3),
            )
        )
        now = _now()
        if out.errors:  # rejected input fails the batch, even if a cancel came meanwhile
            self._b.errors = BatchErrors(data=out.errors)
            transition(self._b, "failed", now)
            self._set_status_attribute()
            return
        self._s.lanes = [  # type: ignore[union-attr]
            Lane(index=r.index, route_id=r.route_id, model=r.model, total=r.total)
            for r in out.routes
        ]
        self._b.request_counts = RequestCounts(total=out.total)
        self._b.model = out.models[0] if len(out.models) == 1 else None
        if self._b.status == "cancelling":  # cancelled while validating: nothing will run
            for lane in self._lanes:
                lane.stop()
            return
        transition(self._b, "in_progress", now)
        if self._indexed:
            workflow.upsert_search_attributes([sa.MODELS.value_set(out.models)])
        self._set_status_attribute()

    def _set_alarm(self) -> None:
        """Wake the main loop at the next deadline (see `ALARMS_ON_TIME` for the two rules; the
        patch is asked only where they differ)."""

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
        if (after != before or passed) and workflow.patched(ALARMS_ON_TIME):
            self._alarm.set(after, ring_if_past=True)
        else:
            self._alarm.set(before)

    @property
    def _quiet(self) -> bool:
        """No demand worth keeping alive: paused, ending or draining."""
        return self._b.backfill.paused or self._ending or self._draining

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
        assert self._input is not None
        lost_too_often = tries.lost >= MAX_LOST_ATTEMPTS
        line = LineInput(
            batch_id=self._b.id,
            input_file_id=self._b.input_file_id,
            endpoint=self._b.endpoint,
            route_id=lane.route_id,
            route_index=lane.index,
            position=position,
            final_attempt=tries.retries >= self._input.max_line_retries,
            give_up_code="line_lost" if lost_too_often else None,
            give_up_message=(
                f"The request's worker was lost {tries.lost} times; it was not retried again."
                if lost_too_often
                else None
            ),
            timeout_seconds=self._input.line_timeout_seconds,
            priority=lane.priority,
            workspace=self._input.workspace,
            key_id=self._input.key_id,
        )
        try:
            outcome: LineOutcome = await workflow.execute_activity_method(
                LineActivities.run_line,
                line,
                start_to_close_timeout=timedelta(seconds=self._input.line_timeout_seconds + 60),
                heartbeat_timeout=timedelta(
                    seconds=self._input.line_heartbeat_timeout_seconds or LINE_HEARTBEAT_SECONDS
                ),
                retry_policy=NO_RETRY,
            )
        except ActivityError as err:
            if (
                is_cancelled_exception(err)
                and workflow.cancellation_reason() is not None
                and workflow.patched(CANCEL_REQUEST_KEEPS_RESULTS)
            ):
                # Cancelled with the workflow: not lost, and not run again. The finalizer reads
                # the store, so the line is completed if it committed a record, else cancelled.
                workflow.logger.info("line %s/%s cancelled", lane.route_id, position)
                self.cancel()
                return
            # The worker running it died (heartbeat timeout) or the activity crashed: the line
            # goes back to the front of the queue; the result store commits it at most once.
            workflow.logger.warning("line %s/%s lost: %s", lane.route_id, position, err.cause)
            lane.requeue(position, tries.model_copy(update={"lost": tries.lost + 1}))
        else:
            if outcome.retry:
                lane.requeue(position, tries.model_copy(update={"retries": tries.retries + 1}))
                # Retry-After holds this batch's lane too, not only (once the scheduler has
                # the signal) the route: no next line before it, whatever the signal's delay.
                honoured = workflow.patched(LANE_HONOURS_RETRY_AFTER)
                lane.back_off(workflow.now().timestamp(), outcome.retry_after if honoured else None)
                if workflow.patched(ROUTE_WIDE_BACKOFF):
                    await self._signal_rate_limited(lane, outcome.retry_after)
            else:
                lane.finish(position)
                self._lines_this_run += 1
                self._count(outcome)
        finally:
            lane.running -= 1
            self._after_line(lane)

    def _count(self, outcome: LineOutcome) -> None:
        counts = self._b.request_counts
        if outcome.ok:
            counts.completed += 1
        else:
            counts.failed += 1
        if outcome.usage is not None:
            self._b.usage.add(outcome.usage)

    def _after_line(self, lane: Lane) -> None:
        if not self._draining and self._run_is_full():
            self._draining = True
        self._dirty = True

    def _run_is_full(self) -> bool:
        """Time to drain and continue as new (decided in `run_length`)."""
        if not workflow.patched(CONTINUE_AS_NEW_BY_HISTORY):
            # A run from before the patch, replayed: its rule exactly (the safety net's drain
            # could come earlier than that and change the commands it recorded).
            return (
                self._lines_this_run >= LINES_PER_RUN
                or workflow.info().is_continue_as_new_suggested()
            )
        info = workflow.info()
        return run_length.run_is_full(
            suggested=info.is_continue_as_new_suggested(),
            events=info.get_current_history_length(),
            size_bytes=info.get_current_history_size(),
        )

    # ---- scheduler protocol ----
    async def _report_demands(self) -> None:
        assert self._input is not None
        halt = self._draining or self._b.backfill.paused or self._ending
        for lane in self._lanes:
            if lane.unacked_epoch is not None and lane.running <= lane.allotment:
                epoch = lane.unacked_epoch
                lane.unacked_epoch = None
                await self._signal_ack(lane, epoch)
            wanted = demand_to_report(lane, halt=halt and not self._draining)
            keepalive = keepalive_due(lane, quiet=self._quiet)
            if wanted is None and keepalive is not None and _reached(keepalive):
                wanted = lane.reported
            if wanted is None:
                continue
            lane.reported = wanted
            lane.reported_at = workflow.now().timestamp()
            lane.allotment = min(lane.allotment, wanted)
            await self._through(
                workflow.start_activity_method(
                    ControlActivities.report_demand,
                    DemandInput(
                        route_id=lane.route_id,
                        batch_id=self._b.id,
                        workspace=self._input.workspace,
                        wanted=wanted,
                        epoch=lane.epoch,
                    ),
                    start_to_close_timeout=timedelta(seconds=30),
                    retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=10)),
                )
            )

    async def _signal_rate_limited(self, lane: Lane, retry_after: float | None) -> None:
        """Tell the route's scheduler, so every batch on the route backs off, not only this one."""
        handle = workflow.get_external_workflow_handle_for(
            refs.RouteSchedulerWorkflow.run, lane.scheduler_id
        )
        try:
            await handle.signal(
                refs.RouteSchedulerWorkflow.rate_limited,
                RateLimited(
                    batch_id=self._b.id,
                    retry_after=retry_after,
                    consecutive=lane.backoff_level,  # refusals since its last success here
                ),
            )
        except Exception as err:  # the scheduler is gone: this batch's own back-off holds
            workflow.logger.info("rate limit report to %s failed: %s", lane.scheduler_id, err)

    async def _signal_ack(self, lane: Lane, epoch: int) -> None:
        handle = workflow.get_external_workflow_handle_for(
            refs.RouteSchedulerWorkflow.run, lane.scheduler_id
        )
        try:
            await handle.signal(
                refs.RouteSchedulerWorkflow.ack,
                Ack(batch_id=self._b.id, epoch=epoch, running=lane.running),
            )
        except Exception as err:  # the scheduler is gone; re-registering brings it back
            workflow.logger.info("ack to %s failed: %s", lane.scheduler_id, err)
            lane.reported = None

    @property
    def _ending(self) -> bool:
        return self._expired or self._b.status == "cancelling"

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
            self._set_status_attribute()
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

    # ---- the end ----
    async def _finish(self) -> None:
        assert self._input is not None
        await self._report_demands()  # leave every scheduler (wanted 0)
        self._check_cancel_request()
        reason: EndReason
        if self._b.status == "cancelling":
            reason = "cancelled"
        elif self._expired:
            reason = "expired"
        else:
            reason = "completed"
            transition(self._b, "finalizing", _now())
            self._set_status_attribute()
        out = await self._through(
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
                retry_policy=RetryPolicy(maximum_attempts=5),
            )
        )
        b = self._b
        b.output_file_id = out.output_file_id
        b.error_file_id = out.error_file_id
        b.request_counts = RequestCounts(
            total=out.total, completed=out.completed, failed=out.failed
        )
        b.usage = Usage()
        b.usage.add(out.usage)
        transition(b, end_status(reason), _now())
        self._update_summary()
        show_done(b)
        self._show_details()
        self._set_status_attribute()
        await self._wait(workflow.all_handlers_finished)

    @property
    def _indexed(self) -> bool:
        """Started with backfill's search attributes (by the api): keep them current. A
        namespace without them registered (the time-skipping test server) gets none."""
        return workflow.info().typed_search_attributes.get(sa.WORKSPACE) is not None

    def _set_status_attribute(self) -> None:
        if self._indexed:
            workflow.upsert_search_attributes([sa.STATUS.value_set(self._b.status)])
            if workflow.patched(STATUS_MEMO_PATCH):
                workflow.upsert_memo({STATUS_MEMO: status_memo(self._b)})

    def _update_summary(self) -> None:
        show_progress(self._b, self._lanes, ending=self._ending)
        self._show_details()

    def _show_details(self) -> None:
        """The UI's current details (no command: a query answers them)."""
        summary: str | None = workflow.memo_value(SUMMARY_MEMO, None, type_hint=str)
        workflow.set_current_details(current_details(self._b, summary))
        b = self._b
        state = _shown_state(b)
        if state != self._logged_status:
            routes = sorted({p.route for p in b.backfill.routes})
            workflow.logger.info(
                "batch %s (%s): %s -> %s on %s",
                b.id,
                b.backfill.workspace,
                self._logged_status,
                state,
                ", ".join(routes) or "no route yet",
                extra={
                    "batch_id": b.id,
                    "workspace": b.backfill.workspace,
                    "status": b.status,
                    "paused": b.backfill.paused,
                    "routes": routes,
                },
            )
            self._logged_status = state


def _shown_state(b: Batch) -> str:
    """The batch's status as its state-change log lines name it (a pause is a change too)."""
    return f"{b.status} (paused)" if b.backfill.paused else b.status


def _now() -> int:
    return int(workflow.now().timestamp())


def _reached(deadline: float) -> bool:
    """Workflow time has reached `deadline` (unix seconds). Runs from before `ALARMS_ON_TIME`
    compared whole seconds; the patch is asked only where the two answers differ."""
    if _now() >= deadline:
        return True
    return workflow.now().timestamp() >= deadline and workflow.patched(ALARMS_ON_TIME)
