"""Reading workflow histories: does a history hold the events a scenario is about?"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import WorkflowHistory

E = EventType


def find(history: WorkflowHistory, kind: int, where: Callable[[HistoryEvent], bool] = bool) -> int:
    """Index of the first event of this type for which `where` holds, or -1."""
    for i, e in enumerate(history.events):
        if e.event_type == kind and where(e):
            return i
    return -1


def require(
    history: WorkflowHistory, kind: int, what: str, where: Callable[..., bool] = bool
) -> int:
    i = find(history, kind, where)
    if i < 0:
        raise AssertionError(f"{history.workflow_id}: the history has no {what}")
    return i


def activity_names(history: WorkflowHistory) -> set[str]:
    return {
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.event_type == E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    }


def completed_result(e: HistoryEvent) -> Any:
    payloads = e.activity_task_completed_event_attributes.result.payloads
    if not payloads or payloads[0].metadata.get("encoding") != b"json/plain":
        return None  # binary/null: an activity returning None
    return json.loads(payloads[0].data)


def signaled(name: str) -> Callable[[HistoryEvent], bool]:
    return lambda e: e.workflow_execution_signaled_event_attributes.signal_name == name


def patch_marker(patch_id: str) -> Callable[[HistoryEvent], bool]:
    """A MARKER_RECORDED event that records `workflow.patched(patch_id)` (the SDK's
    `core_patch` marker, whose `patch-data` payload names the patch)."""

    def names_it(e: HistoryEvent) -> bool:
        a = e.marker_recorded_event_attributes
        if a.marker_name != "core_patch" or "patch-data" not in a.details:
            return False
        return any(
            json.loads(p.data).get("id") == patch_id for p in a.details["patch-data"].payloads
        )

    return names_it


def updated(name: str) -> Callable[[HistoryEvent], bool]:
    return lambda e: (
        e.workflow_execution_update_accepted_event_attributes.accepted_request.input.name == name
    )  # noqa: E501
