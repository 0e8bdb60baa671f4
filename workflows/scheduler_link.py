"""The batch's side of the protocol with its routes' schedulers (docs/decisions/0001, 0003).

Per route, the batch reports its demand (`report_demand`, signal-with-start from an activity,
only when `backfill.batches.lanes.demand_to_report` says it is worth saying, plus an hourly
keep-alive while it waits for an allotment); it receives allotments (`BatchWorkflow.set_allotment`,
`Lane.set_allotment`); it acks a shrunk allotment once its running lines are within it; and it
tells the scheduler when a line was rate limited, so the whole route backs off.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from activities.control import ControlActivities
    from backfill.batches.lanes import Lane, demand_to_report, pace_to_report
    from backfill.batches.lifecycle import keepalive_due
    from backfill.platform import refs
    from backfill.platform.messages import Ack, DemandInput
    from backfill.routes.gates.backoff import RateLimited
    from workflows.cancellation import CancelRequests
    from workflows.patches import ALARMS_ON_TIME, DEADLINE_PACE_COUNTED


class SchedulerLink:
    def __init__(self, batch_id: str, workspace: str, cancellation: CancelRequests) -> None:
        self._batch_id = batch_id
        self._workspace = workspace
        self._cancellation = cancellation

    async def report_demands(
        self,
        lanes: list[Lane],
        *,
        halt: Callable[[], bool],
        quiet: Callable[[], bool],
        expires_at: float | None = None,
    ) -> None:
        """Ack shrunk allotments the lanes are now within, and report each lane's demand where
        it changed enough or its keep-alive is due. Asked per lane (the batch changes while a
        report is sent): `halt`, no line may start (paused or ending; a draining run keeps its
        demand for the next run); `quiet`, no keep-alive (paused, ending or draining).

        A demand also carries the batch's `expires_at` and the lane's mean line time, and is
        reported when `pace_to_report` says the scheduler's view of them is out of date (patch
        `deadline-pace-counted`, asked only where a report is sent or would be). Whether a
        report is sent never depends on the mean's value, only on counts: see `pace_to_report`."""
        for lane in lanes:
            if lane.unacked_epoch is not None and lane.running <= lane.allotment:
                epoch = lane.unacked_epoch
                lane.unacked_epoch = None
                await self._ack(lane, epoch)
            wanted = demand_to_report(lane, halt=halt())
            keepalive = keepalive_due(lane, quiet=quiet())
            if wanted is None and keepalive is not None and reached(keepalive):
                wanted = lane.reported
            if wanted is None:
                pace = pace_to_report(lane, halt=halt())
                if pace is not None and workflow.patched(DEADLINE_PACE_COUNTED):
                    wanted = pace
            if wanted is None:
                continue
            paced = workflow.patched(DEADLINE_PACE_COUNTED)
            if paced:
                lane.reported_timed_lines = lane.timed_lines
            lane.reported = wanted
            lane.reported_at = workflow.now().timestamp()
            lane.allotment = min(lane.allotment, wanted)
            await self._cancellation.through(
                workflow.start_activity_method(
                    ControlActivities.report_demand,
                    DemandInput(
                        route_id=lane.route_id,
                        batch_id=self._batch_id,
                        workspace=self._workspace,
                        wanted=wanted,
                        epoch=lane.epoch,
                        expires_at=expires_at if paced else None,
                        line_seconds=lane.line_seconds if paced else None,
                    ),
                    start_to_close_timeout=timedelta(seconds=30),
                    retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=10)),
                )
            )

    async def rate_limited(self, lane: Lane, retry_after: float | None) -> None:
        """Tell the route's scheduler, so every batch on the route backs off, not only this one."""
        handle = workflow.get_external_workflow_handle_for(
            refs.RouteSchedulerWorkflow.run, lane.scheduler_id
        )
        try:
            await handle.signal(
                refs.RouteSchedulerWorkflow.rate_limited,
                RateLimited(
                    batch_id=self._batch_id,
                    retry_after=retry_after,
                    consecutive=lane.backoff_level,  # refusals since its last success here
                ),
            )
        except Exception as err:  # the scheduler is gone: this batch's own back-off holds
            workflow.logger.info("rate limit report to %s failed: %s", lane.scheduler_id, err)

    async def _ack(self, lane: Lane, epoch: int) -> None:
        handle = workflow.get_external_workflow_handle_for(
            refs.RouteSchedulerWorkflow.run, lane.scheduler_id
        )
        try:
            await handle.signal(
                refs.RouteSchedulerWorkflow.ack,
                Ack(batch_id=self._batch_id, epoch=epoch, running=lane.running),
            )
        except Exception as err:  # the scheduler is gone; re-registering brings it back
            workflow.logger.info("ack to %s failed: %s", lane.scheduler_id, err)
            lane.reported = None


def reached(deadline: float) -> bool:
    """Workflow time has reached `deadline` (unix seconds). Runs from before `ALARMS_ON_TIME`
    compared whole seconds; the patch is asked only where the two answers differ."""
    if int(workflow.now().timestamp()) >= deadline:
        return True
    return workflow.now().timestamp() >= deadline and workflow.patched(ALARMS_ON_TIME)
