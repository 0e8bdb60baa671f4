"""JSON log lines (backfill/platform/logs.py): context fields kept, anything else left out."""

from __future__ import annotations

import json
import logging

from backfill.platform.logs import JsonFormatter


def record(**extra: object) -> logging.LogRecord:
    logger = logging.getLogger("test.logs")
    rec = logger.makeRecord(
        "test.logs", logging.INFO, __file__, 1, "batch %s: %s", ("b1", "in_progress"), None
    )
    rec.__dict__.update(extra)
    return rec


def test_a_line_is_one_json_object_with_the_named_context() -> None:
    line = JsonFormatter().format(
        record(
            batch_id="b1",
            route="r1",
            workspace="ws",
            temporal_workflow={"workflow_id": "b1", "run_id": "run", "workflow_type": "Batch"},
        )
    )
    assert "\n" not in line
    doc = json.loads(line)
    assert doc["message"] == "batch b1: in_progress"
    assert doc["level"] == "INFO" and doc["logger"] == "test.logs"
    assert (doc["batch_id"], doc["route"], doc["workspace"]) == ("b1", "r1", "ws")
    assert doc["temporal_workflow.workflow_id"] == "b1"


def test_other_extra_values_never_reach_the_output() -> None:
    line = JsonFormatter().format(
        record(body='{"messages": "secret"}', authorization="Bearer sk-123", batch_id="b1")
    )
    assert "secret" not in line and "sk-123" not in line
    assert json.loads(line)["batch_id"] == "b1"
