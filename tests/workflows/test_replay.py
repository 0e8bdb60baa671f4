"""Replay saved histories of real runs: a workflow change that would break batches already
running fails here. Histories are append-only: a change that makes one fail needs
`workflow.patched` or a new workflow type, never a re-record (docs/developing.md). New histories
of the current code: `python -m tests.workflows.record_histories` (it never overwrites)."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from workflows.batch import BatchWorkflow
from workflows.scheduler import RouteSchedulerWorkflow

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))


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
    } <= names


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_replay(path: Path) -> None:
    replayer = Replayer(
        workflows=[BatchWorkflow, RouteSchedulerWorkflow],
        data_converter=pydantic_data_converter,
    )
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    await replayer.replay_workflow(history)
