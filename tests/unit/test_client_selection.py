"""Which lines `backfill batch retry` sends again (tools/client/selection.py) and how the
watcher words a batch, without a server."""

from __future__ import annotations

import json

import pytest
from openai.types import Batch

from backfill.batches.eta import ProgressLog
from tools.client.selection import input_lines, parse_kinds, to_retry
from tools.client.watching import view_of, wait_reason


def answered(cid: str, status: int) -> dict[str, object]:
    return {"custom_id": cid, "response": {"status_code": status, "body": {}}, "error": None}


def ended(cid: str, code: str) -> dict[str, object]:
    return {"custom_id": cid, "response": None, "error": {"code": code, "message": "m"}}


RECORDS = [
    answered("a", 400),
    answered("b", 500),
    ended("c", "batch_expired"),
    ended("d", "batch_cancelled"),
    ended("e", "response_too_large"),
]


def test_failed_expired_and_cancelled_lines_are_told_apart() -> None:
    assert to_retry(RECORDS, {"failed"}, set()) == {"a", "b", "e"}
    assert to_retry(RECORDS, {"expired"}, set()) == {"c"}
    assert to_retry(RECORDS, {"failed", "cancelled"}, {400}) == {"b", "d", "e"}


@pytest.mark.parametrize("text", ["", "failed,bogus", " , "])
def test_only_takes_known_kinds(text: str) -> None:
    with pytest.raises(ValueError):
        parse_kinds(text)


def test_the_input_lines_come_back_byte_for_byte() -> None:
    lines = [json.dumps({"custom_id": c, "body": {"x": c}}).encode() for c in "abc"]
    content = b"\n".join(lines) + b"\n\n"
    assert input_lines(content, {"a", "c"}) == [lines[0], lines[2]]


def batch(**extra: object) -> Batch:
    return Batch.model_validate(
        {
            "id": "batch_1",
            "object": "batch",
            "endpoint": "/v1/chat/completions",
            "input_file_id": "f",
            "completion_window": "24h",
            "status": "in_progress",
            "created_at": 0,
            "in_progress_at": 0,
            "request_counts": {"total": 100, "completed": 40, "failed": 10},
            **extra,
        }
    )


def test_the_watcher_says_why_lines_wait_and_works_without_the_extension() -> None:
    routes = [{"model": "demo", "route": "r1", "reason": "Yielding to live traffic"}]
    assert wait_reason(batch(backfill={"routes": routes})) == "demo: Yielding to live traffic"
    assert wait_reason(batch(backfill={"paused": True, "paused_by": "k"})) == "Paused by k"
    plain = view_of(batch(), ProgressLog(), now=100.0)  # an OpenAI server: no extension
    assert plain.reason == "" and plain.lines_per_second == 0.5 and plain.eta_seconds == 100
    assert plain.line() == (
        "batch_1 in_progress · 50/100 done (40 completed, 10 failed) · 0.5 lines/s · ETA 0:01:40"
    )
