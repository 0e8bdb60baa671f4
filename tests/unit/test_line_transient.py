"""A batch line's transient answers (429, 502, 503, 504, a reset connection) go back to the
queue with the upstream's Retry-After; the route's priority hint goes in vLLM routes' bodies."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from email.utils import format_datetime
from pathlib import Path

import httpx
import pytest

from activities.lines.answers import parse_retry_after
from tests.unit.test_run_line import line, make, record, run


@pytest.mark.parametrize("status", [429, 502, 503, 504])
def test_not_now_answers_are_retried_with_retry_after(tmp_path: Path, status: int) -> None:
    headers = {"retry-after": "7"}
    acts, file_id, store = make(
        tmp_path, lambda r: httpx.Response(status, json={}, headers=headers)
    )
    out = run(acts, line(file_id, final=False))
    assert out.retry and out.retry_after == 7 and out.status_code == status
    assert store.get_result("batch_unit", 0) is None


def test_a_reset_connection_is_retried_then_recorded_on_the_final_attempt(tmp_path: Path) -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        raise httpx.ReadError("Connection reset by peer", request=req)

    acts, file_id, store = make(tmp_path, handler)
    assert run(acts, line(file_id, final=False)).retry
    out = run(acts, line(file_id, final=True))
    assert out.error_code == "upstream_error" and record(store)["error"]["code"] == "upstream_error"


def test_retry_after_as_seconds_or_an_http_date() -> None:
    assert parse_retry_after("2") == 2.0
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None
    when = format_datetime(datetime.fromtimestamp(1_000_030, UTC), usegmt=True)
    assert parse_retry_after(when, now=1_000_000) == 30.0
    assert parse_retry_after(when, now=2_000_000) == 0.0


def test_the_priority_hint_goes_in_the_body_of_vllm_routes_only(tmp_path: Path) -> None:
    seen: list[dict[str, object]] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(json.loads(req.content))
        return httpx.Response(200, json={"id": "x"})

    acts, file_id, _ = make(tmp_path, handler)
    run(acts, line(file_id, position=0).model_copy(update={"priority": 10}))
    run(acts, line(file_id, position=1))
    assert seen[0]["priority"] == 10 and "priority" not in seen[1]
    cloud = acts.settings.model_copy(
        update={
            "models": [
                m.model_copy(
                    update={
                        "routes": [r.model_copy(update={"provider": "openai"}) for r in m.routes]
                    }
                )
                for m in acts.settings.models
            ]
        }
    )
    acts.settings = cloud
    run(acts, line(file_id, position=2).model_copy(update={"priority": 10}))
    assert "priority" not in seen[2]
