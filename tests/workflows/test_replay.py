"""Replay saved histories of real runs: a workflow change that would break batches already
running fails here. To add or refresh histories after a deliberate change (guarded with
`workflow.patched`), run `python -m tests.workflows.record_histories` (docs/operations.md)."""

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
    } <= names


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_replay(path: Path) -> None:
    replayer = Replayer(
        workflows=[BatchWorkflow, RouteSchedulerWorkflow],
        data_converter=pydantic_data_converter,
    )
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    await replayer.replay_workflow(history)
