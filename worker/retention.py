"""The retention Schedule: a Temporal Schedule that starts `RetentionWorkflow` every
`cleanup_interval_seconds` on this deployment's task queue. Every worker ensures it at start
(creating it, or updating its interval), so no extra process or cron is needed."""

from __future__ import annotations

import logging
from datetime import timedelta

from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleUpdate,
    ScheduleUpdateInput,
)

from backfill.platform.config import Settings
from backfill.platform.messages import CleanupInput
from workflows.retention import RetentionWorkflow

log = logging.getLogger(__name__)


def schedule_id(task_queue: str) -> str:
    return f"backfill-retention:{task_queue}"


def _schedule(settings: Settings) -> Schedule:
    return Schedule(
        action=ScheduleActionStartWorkflow(
            RetentionWorkflow.run,
            CleanupInput(),
            id=f"retention:{settings.task_queue}",
            task_queue=settings.task_queue,
        ),
        spec=ScheduleSpec(
            intervals=[
                ScheduleIntervalSpec(every=timedelta(seconds=settings.cleanup_interval_seconds))
            ]
        ),
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
    )


async def ensure_schedule(client: Client, settings: Settings) -> None:
    if settings.cleanup_interval_seconds <= 0:
        return
    sid = schedule_id(settings.task_queue)
    wanted = _schedule(settings)
    try:
        await client.create_schedule(sid, wanted)
        log.info("created the retention schedule %s", sid)
        return
    except ScheduleAlreadyRunningError:
        pass

    def update(current: ScheduleUpdateInput) -> ScheduleUpdate:
        return ScheduleUpdate(schedule=wanted)

    await client.get_schedule_handle(sid).update(update)
