"""run_line against a mocked upstream (httpx.MockTransport): each outcome a user sees in the
output and error files, and the exactly-once commit."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from prometheus_client import REGISTRY
from temporalio.testing import ActivityEnvironment

from activities.lines.run_line import MAX_RESENDS, LineActivities
from activities.validation import ValidationActivities
from backfill.files import FileStore
from backfill.platform.config import Settings
from backfill.platform.messages import LineInput, ValidateInput

BATCH = "batch_unit"
Handler = Callable[[httpx.Request], httpx.Response]


def make(tmp_path: Path, handler: Handler) -> tuple[LineActivities, str, FileStore]:
    settings = Settings(
        data_dir=tmp_path,
        models=[{"id": "demo", "routes": [{"id": "r1", "base_url": "http://upstream/v1"}]}],
        limits={"line_timeout_seconds": 0.3, "max_response_bytes": 2048},
    )
    store = FileStore(tmp_path)
    up = store.begin_upload(1 << 20)
    for i in range(3):
        line = {
            "custom_id": f"c{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "demo", "messages": [{"role": "user", "content": "hi"}]},
        }
        up.write(json.dumps(line).encode() + b"\n")
    file_id = up.finish(workspace="w", filename="in.jsonl", purpose="batch").id
    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    acts = LineActivities(settings, store, http)
    out = asyncio.run(
        ActivityEnvironment().run(
            ValidationActivities(settings, store).validate_input,
            ValidateInput(batch_id=BATCH, input_file_id=file_id, endpoint="/v1/chat/completions"),
        )
    )
    assert out.total == 3 and not out.errors
    return acts, file_id, store


def line(file_id: str, position: int = 0, final: bool = True) -> LineInput:
    return LineInput(
        batch_id=BATCH,
        input_file_id=file_id,
        endpoint="/v1/chat/completions",
        route_id="r1",
        route_index=0,
        position=position,
        final_attempt=final,
    )


def run(acts: LineActivities, inp: LineInput):  # type: ignore[no-untyped-def]
    return asyncio.run(ActivityEnvironment().run(acts.run_line, inp))


def record(store: FileStore, line_no: int = 0) -> dict:  # type: ignore[type-arg]
    data = store.get_result(BATCH, line_no)
    assert data is not None
    return json.loads(data)  # type: ignore[no-any-return]


OK_BODY = {"id": "x", "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}


def test_success_is_committed_with_usage_and_the_batch_header(tmp_path: Path) -> None:
    seen: list[httpx.Request] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        return httpx.Response(200, json=OK_BODY, headers={"x-request-id": "req-1"})

    acts, file_id, store = make(tmp_path, handler)
    out = run(acts, line(file_id))
    assert out.ok and out.status_code == 200 and out.usage.total_tokens == 5
    assert str(seen[0].url) == "http://upstream/v1/chat/completions"
    assert seen[0].headers["X-Backfill-Batch"] == BATCH
    assert json.loads(seen[0].content)["model"] == "demo"
    rec = record(store)
    assert rec["custom_id"] == "c0" and rec["error"] is None
    # The record names the attempt's own X-Request-ID (the one sent), not the upstream's.
    rid = seen[0].headers["X-Request-ID"]
    assert rid.startswith("req_") and rid != "req-1"
    assert rec["response"] == {"status_code": 200, "request_id": rid, "body": OK_BODY}


def test_a_committed_line_is_never_sent_again(tmp_path: Path) -> None:
    calls = []

    def handler(req: httpx.Request) -> httpx.Response:
        calls.append(req)
        return httpx.Response(200, json=OK_BODY)

    acts, file_id, store = make(tmp_path, handler)
    first = run(acts, line(file_id))
    again = run(acts, line(file_id))  # e.g. its worker died after committing
    assert len(calls) == 1 and again == first


def test_client_errors_go_to_the_error_file_with_their_response(tmp_path: Path) -> None:
    acts, file_id, store = make(
        tmp_path, lambda r: httpx.Response(400, json={"error": {"message": "bad"}})
    )
    out = run(acts, line(file_id))
    assert not out.ok and not out.retry and out.status_code == 400
    assert record(store)["response"]["body"] == {"error": {"message": "bad"}}


@pytest.mark.parametrize("status", [429, 503])
def test_rate_limits_are_retried_then_committed_on_the_final_attempt(
    tmp_path: Path, status: int
) -> None:
    acts, file_id, store = make(tmp_path, lambda r: httpx.Response(status, json={}))
    out = run(acts, line(file_id, final=False))
    assert out.retry and store.get_result(BATCH, 0) is None  # back to the queue, no record
    out = run(acts, line(file_id, final=True))
    assert not out.retry and not out.ok and record(store)["response"]["status_code"] == status


def test_connection_refused_is_retried(tmp_path: Path) -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=req)

    acts, file_id, store = make(tmp_path, handler)
    assert run(acts, line(file_id, final=False)).retry
    out = run(acts, line(file_id, final=True))
    assert out.error_code == "connection_error" and record(store)["response"] is None


@pytest.mark.parametrize(
    "error",
    [
        httpx.RemoteProtocolError("Server disconnected without sending a response."),
        httpx.ReadError(""),
        httpx.WriteError("Broken pipe"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_a_request_the_server_never_answered_is_sent_again_at_once(
    tmp_path: Path, error: httpx.TransportError
) -> None:
    calls: list[bytes] = []

    def handler(req: httpx.Request) -> httpx.Response:
        calls.append(req.content)
        if len(calls) == 1:  # a pooled connection the server closed as the request went out
            raise error
        return httpx.Response(200, json=OK_BODY)

    acts, file_id, store = make(tmp_path, handler)
    out = run(acts, line(file_id, final=False))
    assert out.ok and not out.retry
    assert len(calls) == 2 and calls[0] == calls[1]  # the same request, in the same attempt
    assert record(store)["response"]["status_code"] == 200


def test_resending_an_unanswered_request_is_bounded(tmp_path: Path) -> None:
    calls = []

    def handler(req: httpx.Request) -> httpx.Response:
        calls.append(req)
        raise httpx.RemoteProtocolError("Server disconnected without sending a response.")

    acts, file_id, store = make(tmp_path, handler)
    out = run(acts, line(file_id))
    assert len(calls) == MAX_RESENDS + 1
    assert out.error_code == "upstream_error" and record(store)["response"] is None


class _BrokenBody(httpx.AsyncByteStream):
    """A response body that breaks after its first bytes (the answer had started)."""

    async def __aiter__(self):  # type: ignore[no-untyped-def]
        yield b'{"id": '
        raise httpx.ReadError("Connection reset by peer")


def test_an_error_after_the_answer_started_is_not_sent_again(tmp_path: Path) -> None:
    calls = []

    def handler(req: httpx.Request) -> httpx.Response:
        calls.append(req)
        return httpx.Response(200, stream=_BrokenBody())

    acts, file_id, store = make(tmp_path, handler)
    out = run(acts, line(file_id))
    assert len(calls) == 1
    assert out.error_code == "upstream_error" and record(store)["response"] is None


def test_a_response_over_the_cap_fails_the_line(tmp_path: Path) -> None:
    acts, file_id, store = make(tmp_path, lambda r: httpx.Response(200, content=b"x" * 5000))
    out = run(acts, line(file_id))
    assert out.error_code == "response_too_large" and not out.ok


def test_a_slow_upstream_fails_the_line_with_request_timeout(tmp_path: Path) -> None:
    async def slow(req: httpx.Request) -> httpx.Response:
        await asyncio.sleep(5)
        return httpx.Response(200, json=OK_BODY)

    acts, file_id, store = make(tmp_path, slow)  # type: ignore[arg-type]
    out = run(acts, line(file_id))
    assert out.error_code == "request_timeout"
    assert record(store)["error"]["code"] == "request_timeout"


def test_give_up_commits_an_error_without_sending(tmp_path: Path) -> None:
    calls = []
    acts, file_id, store = make(tmp_path, lambda r: calls.append(r) or httpx.Response(200))
    inp = line(file_id).model_copy(update={"give_up_code": "line_lost", "give_up_message": "m"})
    out = run(acts, inp)
    assert out.error_code == "line_lost" and calls == []
    assert record(store)["error"] == {"code": "line_lost", "message": "m"}


def test_finished_lines_are_counted_by_outcome_and_a_retry_is_not(tmp_path: Path) -> None:
    def count(outcome: str) -> float:
        labels = {"provider": "r1", "outcome": outcome}
        return REGISTRY.get_sample_value("gateway_batch_line_outcomes_total", labels) or 0.0

    def observed() -> float:
        labels = {"provider": "r1"}
        return REGISTRY.get_sample_value("gateway_batch_line_seconds_count", labels) or 0.0

    answers = iter([503, 503, 500])
    acts, file_id, _ = make(tmp_path, lambda r: httpx.Response(next(answers), json={}))
    before = {o: count(o) for o in ("2xx", "4xx", "5xx", "error")}
    seen = observed()
    assert run(acts, line(file_id, final=False)).retry  # back to the queue: not finished
    assert count("5xx") == before["5xx"] and observed() == seen
    run(acts, line(file_id, final=True))  # 503 on the final attempt: committed
    run(acts, line(file_id, position=1))  # 500
    assert count("5xx") == before["5xx"] + 2 and observed() == seen + 2
    assert count("2xx") == before["2xx"] and count("error") == before["error"]


# ---- a line that cannot be read ends failed, never lost ---------------------------------------

DEEP_LINE = (
    b'{"custom_id": "c0", "method": "POST", "url": "/v1/chat/completions", "body": {"model": '
    b'"demo", "messages": [{"role": "user", "content": "hi"}], "x": '
    + b"[" * 5000
    + b"]" * 5000
    + b"}}"
)
"""A line validated by older rules (deeper than today's limit): Python's decoder raised
RecursionError on it, which escaped run_line, so the line was re-queued forever."""


@pytest.mark.parametrize("give_up", [False, True], ids=["run", "give_up"])
def test_a_line_too_deep_to_read_is_committed_as_failed(tmp_path: Path, give_up: bool) -> None:
    calls: list[httpx.Request] = []
    acts, file_id, store = make(tmp_path, lambda r: calls.append(r) or httpx.Response(200))
    store.read_line = lambda *args: DEEP_LINE  # type: ignore[method-assign]
    inp = line(file_id)
    if give_up:
        inp = inp.model_copy(update={"give_up_code": "line_lost", "give_up_message": "m"})
    out = run(acts, inp)
    assert not out.ok and not out.retry and calls == []
    rec = record(store)
    assert rec["custom_id"] == "line-1" and rec["response"] is None
    if give_up:
        assert rec["error"] == {"code": "line_lost", "message": "m"}
    else:
        assert rec["error"]["code"] == "invalid_json_line"
        assert "more than 128 levels deep" in rec["error"]["message"]


def test_an_unexpected_exception_reading_the_line_commits_a_failed_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[httpx.Request] = []
    acts, file_id, store = make(tmp_path, lambda r: calls.append(r) or httpx.Response(200))

    def broken(*args: object, **kwargs: object) -> object:
        raise RuntimeError("a bug")

    monkeypatch.setattr("activities.lines.run_line.strict_json.loads", broken)
    out = run(acts, line(file_id))
    assert out.error_code == "internal_error" and not out.retry and calls == []
    assert record(store)["error"] == {"code": "internal_error", "message": "RuntimeError: a bug"}


def test_an_unexpected_exception_sending_the_line_commits_a_failed_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    acts, file_id, store = make(tmp_path, lambda r: httpx.Response(200, json=OK_BODY))

    def broken(*args: object, **kwargs: object) -> object:
        raise KeyError("body")

    monkeypatch.setattr("activities.lines.run_line.upstream_body", broken)
    out = run(acts, line(file_id, final=False))  # not the final attempt: still no loop
    assert out.error_code == "internal_error" and not out.retry
    rec = record(store)
    assert rec["custom_id"] == "c0" and rec["error"]["code"] == "internal_error"


def test_the_line_is_decoded_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from activities.lines import run_line as lines

    acts, file_id, store = make(tmp_path, lambda r: httpx.Response(200, json=OK_BODY))
    decoded: list[bytes] = []
    real = lines.strict_json.loads

    def counting(data: bytes, **kwargs: bool) -> object:
        decoded.append(bytes(data))
        return real(data, **kwargs)

    monkeypatch.setattr("activities.lines.run_line.strict_json.loads", counting)
    assert run(acts, line(file_id)).ok
    raw = store.read_line(BATCH, file_id, 0)
    assert decoded.count(raw) == 1  # the other decoding is the upstream's answer
    assert len(decoded) == 2


def test_a_client_priority_is_dropped_where_the_route_has_no_hint(tmp_path: Path) -> None:
    seen: list[dict[str, object]] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(json.loads(req.content))
        return httpx.Response(200, json=OK_BODY)

    acts, file_id, store = make(tmp_path, handler)
    raw = store.read_line(BATCH, file_id, 0)
    with_priority = raw.replace(b'"model": "demo"', b'"model": "demo", "priority": -100')
    assert with_priority != raw
    store.read_line = lambda *args: with_priority  # type: ignore[method-assign]
    run(acts, line(file_id, position=0))  # no hint: no priority at all
    run(acts, line(file_id, position=1).model_copy(update={"priority": 10}))  # the hint wins
    assert "priority" not in seen[0] and seen[1]["priority"] == 10
    assert seen[0]["model"] == "demo"
