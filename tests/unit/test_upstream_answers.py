"""Whatever a model server answers, a line ends in exactly one readable record and the batch
goes on: odd `usage` values, bodies that are not JSON, NaN, huge numbers, wrong types. Each test
is named after what it protects; the property tests throw random answers at run_line."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from activities.finalizing import FinalizeActivities
from activities.lines.answers import RETRYABLE_STATUS
from backfill.batches.records import one_line, outcome_from_record, response_record_bytes, usage_of
from backfill.platform import strict_json
from backfill.platform.messages import FinalizeInput
from tests.unit.test_run_line import BATCH, line, make, record, run


@pytest.mark.parametrize(
    "usage",
    [
        "n/a",
        {},
        {"prompt_tokens": "n/a", "completion_tokens": 2},
        {"prompt_tokens": 1e400, "completion_tokens": 2},
        {"prompt_tokens": -3, "completion_tokens": 2},
        {"prompt_tokens": 1.5, "completion_tokens": 2},
        {"prompt_tokens": True, "completion_tokens": 2},
        {"prompt_tokens": 3, "completion_tokens": 2, "prompt_tokens_details": "cached"},
        {
            "prompt_tokens": 3,
            "completion_tokens": 2,
            "prompt_tokens_details": {"cached_tokens": "x"},
        },
        {"prompt_tokens": 3, "completion_tokens": 2, "completion_tokens_details": []},
        [1, 2],
        None,
    ],
)
def test_an_unreadable_usage_counts_as_no_usage(usage: object) -> None:
    assert usage_of(usage) is None


def test_a_readable_usage_is_counted_with_its_details() -> None:
    u = usage_of(
        {
            "prompt_tokens": 7,
            "completion_tokens": 3.0,
            "prompt_tokens_details": {"cached_tokens": 2},
            "completion_tokens_details": None,
        }
    )
    assert u is not None
    assert (u.input_tokens, u.output_tokens, u.total_tokens, u.cached_tokens) == (7, 3, 10, 2)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"not json",
        b"[]",
        b'{"response": 5}',
        b'{"response": {"status_code": "200"}}',
        b'{"response": {"status_code": 200, "body": {"usage": {"prompt_tokens": NaN}}}}',
        b"\xff\xfe",
        b'{"error": "x"}',
        b"[" * 100_000,
    ],
)
def test_a_committed_record_never_makes_counting_raise(data: bytes) -> None:
    out = outcome_from_record(4, data)
    assert out.line == 4 and not out.ok


def test_odd_usage_values_complete_the_line_without_usage(tmp_path: Path) -> None:
    body = b'{"id": "x", "usage": {"prompt_tokens": "n/a", "completion_tokens": 1e400}}'
    acts, file_id, store = make(tmp_path, lambda r: httpx.Response(200, content=body))
    out = run(acts, line(file_id))
    assert out.ok and out.usage is None
    assert outcome_from_record(0, store.get_result(BATCH, 0) or b"") == out


def test_a_2xx_that_is_not_json_fails_the_line_as_invalid_response(tmp_path: Path) -> None:
    html = b"<html><body>Welcome to nginx</body></html>"
    headers = {"content-type": "text/html"}
    acts, file_id, store = make(
        tmp_path, lambda r: httpx.Response(200, content=html, headers=headers)
    )
    out = run(acts, line(file_id))
    assert not out.ok and out.error_code == "invalid_response"
    rec = record(store)
    assert rec["error"]["code"] == "invalid_response" and "text/html" in rec["error"]["message"]


@pytest.mark.parametrize("body", [b'{"x": NaN}', b'{"x": Infinity}', b"[1, 2]", b'"text"'])
def test_a_2xx_with_nan_or_not_an_object_is_invalid_and_never_written_as_bad_json(
    tmp_path: Path, body: bytes
) -> None:
    acts, file_id, store = make(tmp_path, lambda r: httpx.Response(200, content=body))
    assert run(acts, line(file_id)).error_code == "invalid_response"
    strict_json.loads(store.get_result(BATCH, 0) or b"", finite=False)


def test_an_error_answer_with_nan_is_kept_as_text_in_valid_json(tmp_path: Path) -> None:
    acts, file_id, store = make(tmp_path, lambda r: httpx.Response(500, content=b'{"e": NaN}'))
    out = run(acts, line(file_id))
    assert out.status_code == 500 and not out.ok
    rec = strict_json.loads(store.get_result(BATCH, 0) or b"", finite=False)
    assert rec["response"]["body"] == {"error": {"message": '{"e": NaN}'}}


def test_the_upstream_is_asked_for_an_uncompressed_answer(tmp_path: Path) -> None:
    seen: list[httpx.Request] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        return httpx.Response(200, json={"id": "x"})

    acts, file_id, _ = make(tmp_path, handler)
    run(acts, line(file_id))
    assert seen[0].headers["accept-encoding"] == "identity"


def test_a_connect_timeout_is_reported_as_one_and_retried(tmp_path: Path) -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        raise httpx.ConnectTimeout("timed out", request=req)

    acts, file_id, store = make(tmp_path, handler)
    assert run(acts, line(file_id, final=False)).retry
    run(acts, line(file_id, final=True))
    err = record(store)["error"]
    assert err["code"] == "connection_error" and "connect" in err["message"]


def test_finalizing_cannot_fail_on_an_unreadable_record_and_reruns_write_the_same_bytes(
    tmp_path: Path,
) -> None:
    acts, file_id, store = make(tmp_path, lambda r: httpx.Response(200, json={"id": "x"}))
    run(acts, line(file_id, position=0))
    store.commit_result(BATCH, 1, b'{"broken": ')  # a torn record, however it got there
    fin = FinalizeActivities(store)
    inp = FinalizeInput(batch_id=BATCH, workspace="w", input_file_id=file_id, reason="cancelled")
    first = fin._finalize(inp)
    assert (first.total, first.completed, first.failed) == (3, 1, 2)
    errors = store.read_file(first.error_file_id or "")
    lines = [strict_json.loads(x) for x in errors.decode().splitlines()]
    assert [e["error"]["code"] for e in lines] == ["internal_error", "batch_cancelled"]
    again = fin._finalize(inp)
    assert store.read_file(again.error_file_id or "") == errors


# ---- property tests ---------------------------------------------------------------------------

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_usage = st.dictionaries(
    st.sampled_from(
        [
            "prompt_tokens",
            "completion_tokens",
            "total_tokens",
            "input_tokens",
            "prompt_tokens_details",
            "completion_tokens_details",
        ]
    ),
    _json_values,
)
_bodies = st.one_of(
    st.binary(max_size=300),
    _json_values.map(lambda v: json.dumps(v).encode()),  # NaN/Infinity included
    st.builds(
        lambda u, extra: json.dumps({"id": "x", "usage": u, **extra}).encode(),
        _usage,
        st.dictionaries(st.text(max_size=5), _json_values, max_size=3),
    ),
)
_headers = st.dictionaries(
    st.sampled_from(["content-type", "x-request-id", "retry-after", "content-encoding", "x-odd"]),
    st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=30),
    max_size=4,
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(status=st.integers(100, 599), body=_bodies, headers=_headers, final=st.booleans())
# Found by a CI run: usage in another endpoint's layout, counted by the reader, not the worker.
@example(
    status=100,
    body=b'{"":"","usage":{"":null,"":null,"":null,"input_tokens":0}}',
    headers={},
    final=False,
)
def test_any_upstream_answer_ends_in_exactly_one_readable_record(
    tmp_path_factory: pytest.TempPathFactory,
    status: int,
    body: bytes,
    headers: dict[str, str],
    final: bool,
) -> None:
    tmp = tmp_path_factory.mktemp("prop")
    headers = {k: v for k, v in headers.items() if k != "content-encoding"}
    acts, file_id, store = make(
        tmp, lambda r: httpx.Response(status, content=body, headers=headers)
    )
    out = run(acts, line(file_id, final=final))  # never raises
    data = store.get_result(BATCH, 0)
    if out.retry:
        assert not final and status in RETRYABLE_STATUS and data is None
        return
    assert data is not None
    strict_json.loads(data, finite=False)  # valid JSON, no NaN
    assert outcome_from_record(0, data) == out
    assert len(list((tmp / "batches" / BATCH / "results").rglob("*.json"))) == 1
    assert run(acts, line(file_id, final=True)) == out  # a rerun never commits a second record


def test_an_answer_is_written_byte_for_byte_as_the_upstream_sent_it(tmp_path: Path) -> None:
    """The record splices the upstream's bytes in (no parse-and-dump, no re-encoding): spacing,
    key order, escapes and non-ASCII text stay exactly as they came."""
    raw = '{ "z": "été \\u00e9 \\n",\n  "a": [1.50, 2e3],  "usage": null }'.encode()

    def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=raw, headers={"content-type": "application/json"})

    acts, file_id, store = make(tmp_path, handler)
    out = run(acts, line(file_id))
    assert out.ok and out.usage is None
    data = store.get_result(BATCH, 0)
    assert data is not None
    assert data.count(raw) == 1 and data.endswith(raw + b'},"error":null}')
    rec = record(store)
    assert rec["response"]["body"] == json.loads(raw) and rec["error"] is None


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(alphabet=st.characters(codec="utf-8")),
        lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(), kids, max_size=4),
        max_leaves=12,
    ),
    st.text(alphabet=st.sampled_from("a\u2028\u2029\u0085\n")),
)
def test_a_record_is_one_line_for_str_splitlines_and_holds_the_same_json(
    body: object, custom_id: str
) -> None:
    """U+2028, U+2029 and U+0085 are legal raw in a JSON string (vLLM sends them so) and end a
    line for `str.splitlines()`: a record is written with them escaped, same value."""
    wire = json.dumps(body, ensure_ascii=False).encode()
    data = response_record_bytes(custom_id, 200, "req-1", wire)
    (text,) = data.decode().splitlines()
    record = json.loads(text)
    assert record["custom_id"] == custom_id and record["response"]["body"] == body
    assert one_line(b"\xe2\x80\xa8\xc2\x85x\xe2\x80\xa9") == b"\\u2028\\u0085x\\u2029"
