"""The job view of a one-line batch (backfill/batches/jobs.py): every state of the mapping, the
fields read from the line's committed record, and the line a job's batch is made of."""

from __future__ import annotations

import json
from typing import Any

import pytest

from backfill.batches.batch import Batch, BatchError, BatchErrors, RequestCounts, RouteProgress
from backfill.batches.input_rules import validate_input
from backfill.batches.jobs import (
    JOB_CUSTOM_ID,
    JOB_MEMO,
    JOB_METADATA,
    LineRecord,
    is_job,
    job_line,
    job_memo,
    job_of,
    job_state,
    read_record,
)
from backfill.batches.records import error_record_bytes, response_record_bytes
from backfill.platform.config import Settings

ANSWER = {"id": "chatcmpl-1", "object": "chat.completion", "choices": []}


def batch(
    status: str = "in_progress",
    *,
    running: int = 0,
    completed: int = 0,
    failed: int = 0,
    paused: bool = False,
    **fields: Any,
) -> Batch:
    b = Batch(
        id="batch_1",
        endpoint="/v1/chat/completions",
        input_file_id="file-1",
        completion_window="24h",
        status=status,  # type: ignore[arg-type]
        created_at=100,
        expires_at=100 + 86400,
        metadata={**JOB_METADATA, "team": "a"},
        request_counts=RequestCounts(total=1, completed=completed, failed=failed),
        **fields,
    )
    b.backfill.paused = paused
    b.backfill.paused_by = "alpha-key" if paused else None
    if status in ("in_progress", "cancelling"):
        b.backfill.routes = [
            RouteProgress(model="demo", route="r", state="x", running_lines=running, total_lines=1)
        ]
    return b


@pytest.mark.parametrize(
    ("b", "state"),
    [
        (batch("validating"), "queued"),
        (batch("in_progress"), "queued"),
        (batch("in_progress", running=1), "running"),
        (batch("in_progress", completed=1), "running"),  # answered: about to finalize
        (batch("in_progress", failed=1, paused=True), "running"),
        (batch("finalizing", completed=1), "running"),
        (batch("validating", paused=True), "paused"),
        (batch("in_progress", paused=True), "paused"),
        (batch("in_progress", running=1, paused=True), "pausing"),
        (batch("cancelling", running=1), "cancelling"),
        (batch("cancelled"), "cancelled"),
        (batch("cancelled", completed=1), "cancelled"),
        (batch("completed", completed=1), "completed"),
        (batch("completed", failed=1), "failed"),  # a failed backend answer is terminal
        (batch("expired"), "failed"),
        (batch("expired", completed=1), "completed"),
        (batch("failed"), "failed"),  # the line was rejected at validation
    ],
)
def test_every_batch_state_maps_to_one_job_state(b: Batch, state: str) -> None:
    assert job_state(b) == state
    assert job_of(b, None).state == state


def test_a_completed_answer_gives_its_request_id_status_and_one_attempt() -> None:
    record = read_record(
        response_record_bytes(JOB_CUSTOM_ID, 200, "req_abc", json.dumps(ANSWER).encode())
    )
    assert record == LineRecord(request_id="req_abc", status_code=200, body=ANSWER, sent=True)
    job = job_of(batch("completed", completed=1, completed_at=150), record)
    assert (job.state, job.attempts, job.request_id, job.status_code) == (
        "completed",
        1,
        "req_abc",
        200,
    )
    assert job.error is None and job.finished_at == 150
    assert job.metadata == {"team": "a"}  # the marker is the gateway's, not the user's


def test_a_backend_error_answer_fails_the_job_with_its_status_and_message() -> None:
    body = {"error": {"message": "'max_tokens' must be an integer >= 1", "type": "x"}}
    record = read_record(response_record_bytes(JOB_CUSTOM_ID, 400, "req_x", json.dumps(body)))
    job = job_of(batch("completed", failed=1, completed_at=160), record)
    assert (job.state, job.attempts, job.status_code, job.request_id) == (
        "failed",
        1,
        400,
        "req_x",
    )
    assert job.error is not None
    assert (job.error.code, job.error.message) == ("http_400", body["error"]["message"])


def test_an_error_answer_without_a_message_gets_a_plain_one() -> None:
    record = read_record(response_record_bytes(JOB_CUSTOM_ID, 500, "req_y", b'"oops"'))
    assert record is not None and record.error is not None
    assert record.error.message == "The backend answered HTTP 500."


def test_attempts_count_a_running_line_and_not_a_line_never_sent() -> None:
    assert job_of(batch("in_progress"), None).attempts == 0
    assert job_of(batch("in_progress", running=1), None).attempts == 1
    never_sent = read_record(error_record_bytes(JOB_CUSTOM_ID, "batch_expired", "too late"))
    expired = job_of(batch("expired", failed=1, expired_at=200), never_sent)
    assert (expired.state, expired.attempts, expired.status_code) == ("failed", 0, None)
    assert expired.error is not None and expired.error.code == "batch_expired"
    too_large = read_record(error_record_bytes(JOB_CUSTOM_ID, "response_too_large", "big"))
    assert job_of(batch("completed", failed=1), too_large).attempts == 1


def test_a_job_rejected_at_validation_fails_with_the_batch_error() -> None:
    errors = BatchErrors(data=[BatchError(code="unknown_model", message="no such model")])
    job = job_of(batch("failed", errors=errors, failed_at=120), None)
    assert job.error is not None
    assert (job.state, job.error.code, job.finished_at) == ("failed", "unknown_model", 120)


def test_an_expired_job_without_a_record_still_says_why() -> None:
    job = job_of(batch("expired", expired_at=200), None)
    assert job.error is not None and job.error.code == "batch_expired"


def test_paused_by_shows_only_while_paused() -> None:
    assert job_of(batch("in_progress", paused=True), None).paused_by == "alpha-key"
    assert job_of(batch("in_progress", running=1, paused=True), None).paused_by == "alpha-key"
    assert job_of(batch("in_progress"), None).paused_by is None


@pytest.mark.parametrize("data", [None, b"", b"not json", b"[1]", b'{"response": 3}'])
def test_an_unreadable_record_reads_as_none(data: bytes | None) -> None:
    assert read_record(data) is None


def test_the_marker_is_exactly_the_metadata_pair() -> None:
    assert is_job({**JOB_METADATA, "x": "y"})
    assert not is_job(None) and not is_job({}) and not is_job({"backfill_job": "yes"})
    assert job_memo(JOB_METADATA) == {JOB_MEMO: True} and job_memo({"a": "b"}) == {}


def test_the_job_line_is_a_valid_one_line_batch_input() -> None:
    import io

    body = {"model": "demo", "messages": [{"role": "user", "content": "héllo"}]}
    line = job_line("/v1/chat/completions", body)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    settings = Settings.model_validate(
        {"models": [{"id": "demo", "routes": [{"id": "r", "base_url": "http://127.0.0.1:1/v1"}]}]}
    )
    out = validate_input(
        io.BytesIO(line), batch_id="b", endpoint="/v1/chat/completions", settings=settings
    )
    assert out.errors == [] and len(out.offsets) == 1
    assert json.loads(line)["body"] == body


def test_the_console_batches_page_marks_jobs() -> None:
    from starlette.requests import Request

    from api.console.batch_pages import why_it_waits
    from api.console.sessions import SessionTable
    from api.console.web import templates
    from api.deps import Identity

    alice = Identity(workspace="alice", role="member", key_name="alice")
    job, plain = batch("in_progress"), batch("in_progress")
    plain.id, plain.metadata = "batch_2", None
    request = Request({"type": "http", "query_string": b"", "headers": [], "path": "/"})
    html = templates.get_template("batches.html").render(
        request=request,
        session=SessionTable().create(alice, now=0),
        identity=alice,
        rows=[job, plain],
        has_more=False,
        next_after=None,
        first_page=True,
        filters={"status": "", "model": "", "workspace": "", "limit": 20},
        statuses=[],
        models=[],
        now=200,
        why_it_waits=why_it_waits,
        is_job=lambda b: is_job(b.metadata),
    )
    rows = html.split("<tr data-batch=")[1:]
    assert len(rows) == 2
    assert 'class="job-marker"' in rows[0] and 'class="job-marker"' not in rows[1]


CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("request_body", "param", "code"),
    [
        ({"path": "/v1/nope", "body": {"model": "demo", "messages": MESSAGES}}, "path", None),
        ({"body": {"model": "demo", "messages": MESSAGES}}, "path", None),
        ({"path": CHAT, "body": "text"}, "body", None),
        ({"path": CHAT, "body": {"messages": MESSAGES}}, "body.model", "invalid_body"),
        (
            {"path": CHAT, "body": {"model": "nope", "messages": MESSAGES}},
            "body.model",
            "unknown_model",
        ),
        (
            {"path": CHAT, "body": {"model": "demo", "messages": []}},
            "body.messages",
            "invalid_body",
        ),
        (
            {"path": CHAT, "body": {"model": "demo", "messages": MESSAGES, "stream": True}},
            "body.stream",
            "invalid_body",
        ),
        (
            {
                "path": CHAT,
                "body": {"model": "demo", "messages": MESSAGES},
                "metadata": JOB_METADATA,
            },
            "metadata",
            None,
        ),
        (
            {
                "path": CHAT,
                "body": {"model": "demo", "messages": MESSAGES},
                "completion_window": "1h",
            },
            "completion_window",
            None,
        ),
    ],
)
def test_a_bad_job_is_a_400_naming_the_field(
    tmp_path: Any, request_body: dict[str, Any], param: str, code: str | None
) -> None:
    """Checked before anything is stored or started (the app has no Temporal client here)."""
    from fastapi.testclient import TestClient

    from api.app import create_app
    from backfill.platform.config import ApiKeyConfig, hash_key

    settings = Settings.model_validate(
        {
            "data_dir": str(tmp_path),
            "models": [
                {"id": "demo", "routes": [{"id": "r", "base_url": "http://127.0.0.1:1/v1"}]}
            ],
            "api_keys": [ApiKeyConfig(sha256=hash_key("sk-j"), workspace="w", name="w")],
        }
    )
    app = create_app(settings, client=object())  # type: ignore[arg-type]
    with TestClient(app, headers={"Authorization": "Bearer sk-j"}) as http:
        r = http.post("/gateway/v1/batches", json=request_body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["param"], err["code"], err["type"]) == (param, code, "invalid_request_error")
    assert not list(tmp_path.rglob("*.data")), "nothing is stored for a bad job"
