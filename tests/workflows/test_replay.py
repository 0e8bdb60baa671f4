"""Replay saved histories of real runs: a workflow change that would break batches already
running fails here. Histories are append-only: a change that makes one fail needs
`workflow.patched` or a new workflow type, never a re-record (docs/developing.md). New histories
of the current code: `python -m tests.workflows.record_histories` (it never overwrites)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from workflows.batch import BatchWorkflow
from workflows.scheduler import RouteSchedulerWorkflow

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))
BATCHES = [p for p in HISTORIES if p.stem.startswith("batch_")]


def test_histories_exist() -> None:
    names = {p.stem for p in HISTORIES}
    assert {
        "batch_completed_paused",
        "batch_cancelled",
        "batch_failed_validation",
        "batch_expired",
        "batch_continued_as_new",
        "route_scheduler",
        "route_scheduler_continued_as_new",
        # A cancellation request landing while an activity runs: before the patch (the run
        # closed as cancelled, no files) and after it (the batch ends with its files).
        "batch_cancel_requested_unpatched_validating",
        "batch_cancel_requested_unpatched_reporting",
        "batch_cancel_requested_unpatched_finalizing",
        "batch_cancel_requested_validating",
        "batch_cancel_requested_reporting",
        "batch_cancel_requested_finalizing",
        # recorded since histories are versioned
        "batch_workflow_cancel_requested.v1",
        "batch_cancel_while_validating.v1",
        "batch_backoff.v1",
        # paused while backing off, resumed after the back-off's end (patch alarms-on-time)
        "batch_paused_in_backoff.v1",
        "batch_line_lost.v1",
        "route_scheduler_set_settings.v1",
        "batch_continue_as_new_chain.run01.v1",
        "batch_continue_as_new_chain.run02.v1",
        "route_scheduler_continue_as_new_chain.run01.v1",
        "route_scheduler_continue_as_new_chain.run02.v1",
        # a terminal batch hands its webhook event over (patch webhook-events)
        "batch_completed_announced.v1",
        "batch_failed_announced.v1",
        # the route's limit raised with the reopen ramp on (patch reopen-ramp)
        "route_scheduler_reopen_ramp.v1",
        # a line back from a worker's door unsent (patch held-line-requeued), and the seats
        # the workers hold back left out of the allotment (patch seats-held-back)
        "batch_held_at_door.v1",
        "route_scheduler_held_back.v1",
        # a batch's demand with its deadline and pace (patch deadline-pace-counted)
        "batch_pace_counted.v1",
        # a 24 h batch behind a 168 h one given the slots it needs (patch deadline-aware-shares)
        "route_scheduler_deadline.v1",
        # a worker started with a changed settings table for the route (patch configured-settings)
        "route_scheduler_configured.v1",
        # finalizing failed on the store for good: the batch ends failed, the run completes
        # (patch store-outage-waits)
        "batch_store_failed.v1",
    } <= names


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_replay(path: Path) -> None:
    replayer = Replayer(
        workflows=[BatchWorkflow, RouteSchedulerWorkflow],
        data_converter=pydantic_data_converter,
    )
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    await replayer.replay_workflow(history)


def at_other_times(history: str, seconds: float) -> str:
    """The history with every other workflow task started `seconds` later than recorded: the
    activations in which a line starts and ends see other times, as on a worker whose
    activation did not run at the time its history says."""
    h = json.loads(history)
    tasks = 0
    for event in h["events"]:
        if event["eventType"] == "EVENT_TYPE_WORKFLOW_TASK_STARTED":
            tasks += 1
            if tasks % 2 == 0:
                at = datetime.fromisoformat(event["eventTime"][:26].rstrip("Z") + "+00:00")
                event["eventTime"] = (at + timedelta(seconds=seconds)).isoformat()
    return json.dumps(h)


@pytest.mark.parametrize("path", BATCHES, ids=[p.stem for p in BATCHES])
async def test_a_batch_schedules_the_same_commands_whatever_time_its_tasks_saw(path: Path) -> None:
    """Whether a batch schedules an activity (a demand report, a line) never hangs on the
    seconds between its workflow tasks: the first version of the pace reports (reverted) sent a
    report when the mean line time, measured between activations, moved by a quarter, and a
    chaos run's batch then failed its replay on another worker with `[TMPRL1100] Activity type
    of scheduled event 'report_demand' does not match ... 'run_line'`. Its own saved history,
    replayed this way, fails with that very error (docs/decisions/0038)."""
    replayer = Replayer(
        workflows=[BatchWorkflow, RouteSchedulerWorkflow],
        data_converter=pydantic_data_converter,
    )
    history = WorkflowHistory.from_json(path.stem, at_other_times(path.read_text(), 1.0))
    await replayer.replay_workflow(history)
