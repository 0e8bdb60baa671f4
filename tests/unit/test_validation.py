"""Unit tests for backfill.batches.input_rules (pure functions, no server)."""

from __future__ import annotations

import io
import json
import time
from typing import Any, BinaryIO, cast

import pytest

from backfill.batches import input_lines
from backfill.batches.input_rules import ValidationOutcome, validate_input
from backfill.files import RouteLines
from backfill.platform.config import Limits, ModelConfig, RouteConfig, Settings

CHAT = "/v1/chat/completions"
BATCH = "batch_test"


def settings(max_lines: int = 5, max_line_bytes: int = 200) -> Settings:
    return Settings(
        models=[
            ModelConfig(id="demo", routes=[RouteConfig(id="r1", base_url="http://127.0.0.1:1/v1")]),
            ModelConfig(
                id="duo",
                routes=[
                    RouteConfig(id="d1", base_url="http://127.0.0.1:2/v1", weight=3),
                    RouteConfig(id="d2", base_url="http://127.0.0.1:3/v1", weight=1),
                ],
            ),
            ModelConfig(
                id="other", routes=[RouteConfig(id="o1", base_url="http://127.0.0.1:4/v1")]
            ),
        ],
        limits=Limits(max_lines_per_batch=max_lines, max_line_bytes=max_line_bytes),
    )


def req(custom_id: Any = "a", *, model: Any = "demo", **over: Any) -> bytes:
    """One request line (no newline). `over` replaces top-level keys; `body=` replaces the body."""
    obj: dict[str, Any] = {
        "custom_id": custom_id,
        "method": "POST",
        "url": CHAT,
        "body": {"model": model, "messages": [{"role": "user", "content": "hi"}]},
    }
    obj.update(over)
    for k in [k for k, v in obj.items() if v is _DROP]:
        del obj[k]
    return json.dumps(obj, separators=(",", ":")).encode()


_DROP = object()


def run(
    data: bytes,
    *,
    endpoint: str = CHAT,
    s: Settings | None = None,
    allowed: frozenset[str] | None = None,
    max_errors: int = 100,
) -> ValidationOutcome:
    return validate_input(
        io.BytesIO(data),
        batch_id=BATCH,
        endpoint=endpoint,
        settings=s or settings(),
        allowed_models=allowed,
        max_errors=max_errors,
    )


def only_error(data: bytes, **kw: Any) -> tuple[str, int | None, str | None, str]:
    out = run(data, **kw)
    assert len(out.errors) == 1, out.errors
    e = out.errors[0]
    return e.code, e.line, e.param, e.message


def slices(data: bytes, out: ValidationOutcome) -> list[bytes]:
    return [data[o : o + n] for o, n in zip(out.offsets, out.lengths, strict=True)]


# ---- valid files ---------------------------------------------------------------------------


def test_valid_file_builds_index() -> None:
    lines = [req("a"), req("b"), req("c")]
    data = b"\n".join(lines) + b"\n"
    out = run(data)
    assert out.errors == []
    assert out.offsets.typecode == "Q" and out.lengths.typecode == "I"
    assert slices(data, out) == lines
    assert out.routes == [RouteLines(route_id="r1", model="demo", count=3)]
    assert [list(a) for a in out.route_line_numbers] == [[0, 1, 2]]
    assert all(a.typecode == "I" for a in out.route_line_numbers)
    assert out.models == ["demo"]


def test_whitespace_lines_skipped_with_physical_line_numbers() -> None:
    data = b"\n   \n" + req("a") + b"\n\t\n\r\n" + req("a") + b"\n"
    code, line, param, _ = only_error(data)
    assert (code, line, param) == ("duplicate_custom_id", 6, "custom_id")

    data = b"\n  \n" + req("a") + b"\n \t \n" + req("b") + b"\n\n"
    out = run(data)
    assert out.errors == []
    assert slices(data, out) == [req("a"), req("b")]
    assert [list(a) for a in out.route_line_numbers] == [[0, 1]]


def test_crlf_input() -> None:
    lines = [req("a"), req("b"), req("c")]
    data = b"\r\n".join(lines) + b"\r\n"
    out = run(data)
    assert out.errors == []
    assert slices(data, out) == lines
    assert list(out.lengths) == [len(x) for x in lines]
    # Errors in a CRLF file still carry the right line numbers.
    data = req("a") + b"\r\n\r\n" + b"{nope\r\n"
    code, line, _, _ = only_error(data)
    assert (code, line) == ("invalid_json_line", 3)


def test_final_line_without_newline() -> None:
    lines = [req("a"), req("b")]
    data = b"\n".join(lines)
    out = run(data)
    assert out.errors == []
    assert slices(data, out) == lines
    code, line, _, _ = only_error(req("a") + b"\n" + b"[1]")
    assert (code, line) == ("invalid_json_line", 2)


def test_offsets_and_lengths_reproduce_lines_across_chunk_boundaries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lines = [req(f"id-{i}", model="duo") for i in range(5)]
    data = b"\n".join([b"  ", lines[0], b"", lines[1], lines[2] + b"\r", lines[3], lines[4]])
    reference = run(data)
    assert reference.errors == []
    assert slices(data, reference) == lines
    for chunk in (1, 2, 3, 7, 64, len(lines[0]), len(lines[0]) + 1):
        monkeypatch.setattr(input_lines, "CHUNK_BYTES", chunk)
        out = run(data)
        assert out == reference, chunk


def test_short_reads() -> None:
    class Trickle(io.RawIOBase):
        def __init__(self, data: bytes) -> None:
            self.buf = io.BytesIO(data)

        def readable(self) -> bool:
            return True

        def read(self, size: int = -1) -> bytes:
            return self.buf.read(min(size, 5) if size >= 0 else 5)

    lines = [req(f"id-{i}") for i in range(3)]
    data = b"\n".join(lines) + b"\n"
    f = cast(BinaryIO, Trickle(data))
    out = validate_input(f, batch_id=BATCH, endpoint=CHAT, settings=settings())
    assert out.errors == []
    assert slices(data, out) == lines


def test_two_route_weighted_model() -> None:
    s = settings(max_lines=1000, max_line_bytes=500)
    lines = [req(f"x{i}", model="duo" if i % 4 else "demo") for i in range(1000)]
    data = b"\n".join(lines) + b"\n"
    out = run(data, s=s)
    assert out.errors == []
    assert out.models == ["demo", "duo"]
    assert [(r.model, r.route_id) for r in out.routes][0] == ("demo", "r1")
    assert {(r.model, r.route_id) for r in out.routes} == {
        ("demo", "r1"),
        ("duo", "d1"),
        ("duo", "d2"),
    }
    assert sum(r.count for r in out.routes) == 1000 == len(out.offsets) == len(out.lengths)
    seen: set[int] = set()
    for r, nums in zip(out.routes, out.route_line_numbers, strict=True):
        as_list = list(nums)
        assert as_list == sorted(as_list) and len(set(as_list)) == len(as_list)
        assert len(as_list) == r.count
        assert not seen & set(as_list)
        seen |= set(as_list)
    assert seen == set(range(1000))
    by_route = {r.route_id: r.count for r in out.routes}
    assert by_route["r1"] == 250
    assert 0.65 <= by_route["d1"] / 750 <= 0.85
    # Deterministic: the same file gives the same index.
    assert run(data, s=s) == out


def test_utf8_bom_at_start_is_ignored() -> None:
    data = b"\xef\xbb\xbf" + req("a") + b"\n" + req("b") + b"\n"
    out = run(data)
    assert out.errors == []
    assert slices(data, out) == [req("a"), req("b")]
    assert out.offsets[0] == 3


def test_other_endpoints_required_fields() -> None:
    body: dict[str, Any] = {"model": "demo", "prompt": "Say hi"}
    out = run(req("a", url="/v1/completions", body=body), endpoint="/v1/completions")
    assert out.errors == []
    body = {"model": "demo", "input": ["a", "b"]}
    out = run(req("a", url="/v1/embeddings", body=body), endpoint="/v1/embeddings")
    assert out.errors == []


# ---- one error class per test --------------------------------------------------------------


def test_invalid_utf8_line() -> None:
    data = req("a") + b"\n" + b'{"custom_id": "caf\xe9"}\n'
    code, line, param, message = only_error(data)
    assert (code, line, param) == ("invalid_json_line", 2, None)
    assert "UTF-8" in message


def test_non_utf8_file_fails_cleanly() -> None:
    text = '{"custom_id": "café", "method": "POST"}\n{"custom_id": "naïve"}\n'
    data = b"\xff\xfe" + text.encode("latin-1")
    out = run(data)
    assert [e.code for e in out.errors] == ["invalid_json_line", "invalid_json_line"]
    assert [e.line for e in out.errors] == [1, 2]
    assert "UTF-8" in out.errors[0].message
    # UTF-16 is not sniffed as JSON either.
    out = run(req("a").decode().encode("utf-16"), s=settings(max_line_bytes=1000))
    assert out.errors[0].code == "invalid_json_line" and out.errors[0].line == 1


@pytest.mark.parametrize(
    "bad", [b"{nope", b"[1, 2]", b'"str"', b"42", b"null", b'{"a": NaN}', b"{} {}", b"[" * 5000]
)
def test_invalid_json_line(bad: bytes) -> None:
    s = settings(max_line_bytes=10_000)
    code, line, param, message = only_error(req("a") + b"\n" + bad + b"\n", s=s)
    assert (code, line, param) == ("invalid_json_line", 2, None)
    assert message


def nested_line(custom_id: str, levels: int) -> bytes:
    """A valid request line nesting `levels` deep in all (the line is level 1, its body 2)."""
    body = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "x": None}
    inner = b"[" * (levels - 2) + b"]" * (levels - 2)
    return req(custom_id, body=body).replace(b'"x":null', b'"x":' + inner)


@pytest.mark.parametrize("levels", [127, 128])
def test_nesting_up_to_the_limit_is_accepted(levels: int) -> None:
    assert run(nested_line("a", levels), s=settings(max_line_bytes=10_000)).errors == []


@pytest.mark.parametrize("levels", [129, 900, 1000, 5000])
def test_a_line_nested_deeper_than_the_limit_is_refused_with_its_line(levels: int) -> None:
    # 900 levels used to pass here (a thread with a fresh stack) and loop forever in run_line.
    deep = nested_line("b", levels)
    s = settings(max_line_bytes=20_000)
    code, line, _, message = only_error(req("a") + b"\n\n" + deep + b"\n", s=s)
    assert (code, line) == ("invalid_json_line", 3)
    assert "more than 128 levels deep" in message


@pytest.mark.parametrize("number", [b"1e999", b"-1E+400", b"9" * 400 + b".5"])
def test_a_number_too_large_for_a_float_is_refused_like_nan(number: bytes) -> None:
    # Python reads 1e999 as infinity and would send it upstream as `Infinity` (invalid JSON).
    line = req("a").replace(b'"model"', b'"temperature":' + number + b',"model"')
    code, lineno, _, message = only_error(line, s=settings(max_line_bytes=10_000))
    assert (code, lineno) == ("invalid_json_line", 1)
    assert "too large" in message


def test_a_large_number_inside_a_string_is_just_text() -> None:
    body = {"model": "demo", "messages": [{"role": "user", "content": "1e999 and [[[["}]}
    assert run(req("a", body=body)).errors == []


@pytest.mark.parametrize("cid", [_DROP, None, "", 7, ["x"]])
def test_missing_custom_id(cid: Any) -> None:
    code, line, param, _ = only_error(req(custom_id=cid))
    assert (code, line, param) == ("missing_custom_id", 1, "custom_id")


def test_duplicate_custom_id() -> None:
    data = b"\n".join([req("a"), req("dup"), req("b"), req("dup")])
    code, line, param, message = only_error(data)
    assert (code, line, param) == ("duplicate_custom_id", 4, "custom_id")
    assert "dup" in message and "line 2" in message


@pytest.mark.parametrize("method", [_DROP, "GET", "post", 1])
def test_invalid_method(method: Any) -> None:
    code, line, param, _ = only_error(req("a", method=method))
    assert (code, line, param) == ("invalid_method", 1, "method")


@pytest.mark.parametrize("url", [_DROP, "/v1/embeddings", "/v1/chat/completions/", 3])
def test_url_mismatch(url: Any) -> None:
    code, line, param, message = only_error(req("a") + b"\n" + req("b", url=url))
    assert (code, line, param) == ("url_mismatch", 2, "url")
    assert CHAT in message
    if url == "/v1/embeddings":
        assert message.startswith("The provided url '/v1/embeddings' does not match the batch")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (_DROP, "body"),
        ("text", "body"),
        ([], "body"),
        ({"messages": []}, "body.model"),
        ({"model": 3, "messages": [{}]}, "body.model"),
        ({"model": "demo"}, "body.messages"),
        ({"model": "demo", "messages": "hi"}, "body.messages"),
        ({"model": "demo", "messages": []}, "body.messages"),
        ({"model": "demo", "messages": [{}], "stream": True}, "body.stream"),
        # Body problems come before the model check.
        ({"model": "nope", "messages": [{}], "stream": True}, "body.stream"),
    ],
)
def test_invalid_body(body: Any, param: str) -> None:
    code, line, got_param, _ = only_error(req("a", body=body))
    assert (code, line, got_param) == ("invalid_body", 1, param)


def test_invalid_body_other_endpoints() -> None:
    for endpoint, field in (("/v1/completions", "prompt"), ("/v1/embeddings", "input")):
        code, line, param, _ = only_error(
            req("a", url=endpoint, body={"model": "demo"}), endpoint=endpoint
        )
        assert (code, line, param) == ("invalid_body", 1, f"body.{field}")
        code, _, param, _ = only_error(
            req("a", url=endpoint, body={"model": "demo", field: 5}), endpoint=endpoint
        )
        assert (code, param) == ("invalid_body", f"body.{field}")


@pytest.mark.parametrize("value", [False, None, 0])
def test_stream_false_is_fine(value: Any) -> None:
    body = {"model": "demo", "messages": [{}], "stream": value}
    assert run(req("a", body=body)).errors == []


@pytest.mark.parametrize("value", [1, "true", "false", "yes", [0], {"on": True}, 0.5])
def test_stream_truthy_in_any_form_is_refused(value: Any) -> None:
    body = {"model": "demo", "messages": [{}], "stream": value}
    code, line, param, _ = only_error(req("a", body=body))
    assert (code, line, param) == ("invalid_body", 1, "body.stream")


def test_custom_id_over_openai_limit_is_refused() -> None:
    roomy = settings(max_line_bytes=2000)
    assert run(req("x" * 512), s=roomy).errors == []
    code, line, param, message = only_error(req("x" * 513), s=roomy)
    assert (code, line, param) == ("invalid_custom_id", 1, "custom_id")
    assert "512" in message


def test_unknown_model() -> None:
    code, line, param, message = only_error(req("a") + b"\n" + req("b", model="gpt-9"))
    assert (code, line, param) == ("unknown_model", 2, "body.model")
    assert "gpt-9" in message


def test_not_allowed_model_reads_like_unknown() -> None:
    allowed = frozenset({"demo"})
    out = run(req("a", model="other") + b"\n" + req("b", model="nope"), allowed=allowed)
    assert [(e.code, e.line, e.param) for e in out.errors] == [
        ("unknown_model", 1, "body.model"),
        ("unknown_model", 2, "body.model"),
    ]
    assert out.errors[0].message == out.errors[1].message.replace("nope", "other")
    assert run(req("a", model="other")).errors == []
    assert run(req("a", model="demo"), allowed=allowed).errors == []


def test_line_too_large_and_following_lines_still_checked() -> None:
    s = settings(max_line_bytes=200)
    base = req("big", pad="")
    big = req("big", pad="x" * (201 - len(base)))
    assert len(big) == 201
    fits = req("fit", pad="y" * (200 - len(base)))
    assert len(fits) == 200
    data = b"\n".join([req("a"), big, fits + b"\r", b"{bad", req("a")]) + b"\n"
    out = run(data, s=s)
    assert [(e.code, e.line, e.param) for e in out.errors] == [
        ("line_too_large", 2, None),
        ("invalid_json_line", 4, None),
        ("duplicate_custom_id", 5, "custom_id"),
    ]
    assert "201" in out.errors[0].message and "200" in out.errors[0].message


def test_line_too_large_spanning_chunks_is_not_buffered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(input_lines, "CHUNK_BYTES", 64)
    huge = b'{"custom_id": "' + b"z" * 100_000 + b'"}'
    data = req("a") + b"\n" + huge + b"\r\n" + b"   " * 100 + b"\n" + req("b")
    out = run(data)
    assert [(e.code, e.line) for e in out.errors] == [("line_too_large", 2)]
    assert str(len(huge)) in out.errors[0].message
    # A long whitespace-only line is still just blank.
    data = req("a") + b"\n" + b" " * 10_000 + b"\n" + req("b")
    out = run(data)
    assert out.errors == []
    assert slices(data, out) == [req("a"), req("b")]


def test_too_many_requests() -> None:
    lines = [req(f"id-{i}") for i in range(6)]
    data = b"\n\n".join(lines) + b"\n"
    code, line, param, message = only_error(data)
    assert (code, line, param) == ("too_many_requests", 11, None)
    assert "5" in message
    # Exactly the limit is fine.
    assert run(b"\n".join(lines[:5])).errors == []


def test_too_many_requests_stops_reading() -> None:
    data = b"\n".join([req(f"id-{i}") for i in range(6)] + [b"{bad"] * 10)
    out = run(data)
    assert [(e.code, e.line) for e in out.errors] == [("too_many_requests", 6)]
    # Invalid lines count as request lines too.
    data = b"\n".join([b"{bad"] * 7)
    out = run(data)
    assert [e.code for e in out.errors] == ["invalid_json_line"] * 5 + ["too_many_requests"]
    assert out.errors[-1].line == 6


@pytest.mark.parametrize("data", [b"", b"\n", b"   \n\t\n\r\n  ", b"\xef\xbb\xbf\n"])
def test_empty_file(data: bytes) -> None:
    code, line, param, _ = only_error(data)
    assert (code, line, param) == ("empty_file", None, None)


def test_max_errors_respected() -> None:
    data = b"\n".join([b"{bad"] * 5)
    out = run(data, max_errors=3)
    assert [e.line for e in out.errors] == [1, 2, 3]
    out = run(data)
    assert len(out.errors) == 5


def test_errors_leave_no_index() -> None:
    out = run(req("a") + b"\n" + req("a"))
    assert out.errors and len(out.offsets) == 0 and out.routes == []


def test_one_error_per_line_first_check_wins() -> None:
    # Duplicate id, wrong method, wrong url and unknown model: the duplicate is reported.
    data = req("a") + b"\n" + req("a", method="GET", url="/x", model="nope")
    code, line, param, _ = only_error(data)
    assert (code, line, param) == ("duplicate_custom_id", 2, "custom_id")


def test_a_responses_line_needs_its_input() -> None:
    url = "/v1/responses"
    ok = req("a", url=url, body={"model": "demo", "input": [{"role": "user", "content": "hi"}]})
    assert run(ok, endpoint=url).errors == []
    missing = req("a", url=url, body={"model": "demo", "messages": []})
    code, line, param, _ = only_error(missing, endpoint=url)
    assert (code, line, param) == ("invalid_body", 1, "body.input")


def test_bad_endpoint_or_max_errors_is_a_caller_bug() -> None:
    with pytest.raises(ValueError):
        run(req("a"), endpoint="/v1/moderations")
    with pytest.raises(ValueError):
        run(req("a"), max_errors=0)


# ---- size and speed ------------------------------------------------------------------------

# CPU time of this process, not wall clock (2 loaded cores stretch wall clock, not CPU time).
# Typically well under 1 s: the limit only catches a regression by an order of magnitude (a
# quadratic step); the speed itself is a bench figure.
SPEED_LIMIT_S = 10.0


def test_large_file_too_many_requests_quickly() -> None:
    s = Settings(models=settings().models)
    assert s.limits.max_lines_per_batch == 50_000
    tiny = b'{"custom_id":"%d","method":"POST","url":"/v1/chat/completions","body":{"model":"demo","messages":[{"role":"user","content":"hi"}]}}'  # noqa: E501
    data = b"\n".join(tiny % i for i in range(50_001)) + b"\n"
    started = time.process_time()
    out = run(data, s=s)
    elapsed = time.process_time() - started
    assert [(e.code, e.line) for e in out.errors] == [("too_many_requests", 50_001)]
    assert "50000" in out.errors[0].message
    assert elapsed < SPEED_LIMIT_S


@pytest.mark.scale  # a CPU-time bound: the size is the subject
def test_fifty_thousand_lines_validate_fast() -> None:
    s = Settings(models=settings().models)
    content = "x" * 150
    lines = [
        req(f"request-{i}", model="duo", body={"model": "duo", "messages": [{"content": content}]})
        for i in range(50_000)
    ]
    data = b"\n".join(lines) + b"\n"
    started = time.process_time()
    out = run(data, s=s)
    elapsed = time.process_time() - started
    assert out.errors == []
    assert len(out.offsets) == 50_000
    assert sum(r.count for r in out.routes) == 50_000
    assert elapsed < SPEED_LIMIT_S


# ---- large files: memory stays bounded -----------------------------------------------------------


def test_seen_ids_finds_every_duplicate_across_table_growth() -> None:
    seen = input_lines.SeenIds()
    for i in range(20_000):  # the table grows from 1,024 slots several times
        assert seen.add(f"id-{i}", i + 1) is None
    assert len(seen) == 20_000
    assert seen.add("id-0", 30_000) == 1
    assert seen.add("id-19999", 30_001) == 20_000
    assert seen.add("id-777", 30_002) == 778
    assert seen.add("new", 30_003) is None
    assert len(seen) == 20_001  # a duplicate is not stored again


class GeneratedFile(io.RawIOBase):
    """A JSONL file of `n` valid request lines made as it is read (never held in memory)."""

    def __init__(self, n: int, pad: int = 200) -> None:
        self.n, self.i = n, 0
        self.template = req("request-%09d", model="duo").replace(b'"hi"', b'"' + b"x" * pad + b'"')
        self.buf = b""

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        if len(self.buf) < size and self.i < self.n:
            end = min(self.n, self.i + size // len(self.template) + 1)
            self.buf += b"\n".join(self.template % j for j in range(self.i, end)) + b"\n"
            self.i = end
        out, self.buf = self.buf[:size], self.buf[size:]
        return out


@pytest.mark.scale  # a memory bound: the size is the subject
def test_a_100k_line_file_validates_in_bounded_memory() -> None:
    """Validation streams: Python's peak allocation for a 100,000-line (30 MB) file is the index
    (16 bytes a line), the custom_id hashes (about 20 bytes a line) and one read chunk; no
    per-line Python objects are kept (keeping the ids in a dict took the peak to 19 MiB)."""
    import tracemalloc

    n = 100_000
    s = settings(max_lines=n, max_line_bytes=1000)
    tracemalloc.start()
    try:
        out = validate_input(
            cast(BinaryIO, GeneratedFile(n)), batch_id=BATCH, endpoint=CHAT, settings=s
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert out.errors == []
    assert len(out.offsets) == n and sum(r.count for r in out.routes) == n
    assert peak < 12 * 2**20, f"peak {peak / 2**20:.1f} MiB"
