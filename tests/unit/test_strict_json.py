"""The one strict JSON decoder: RFC 8259 only, UTF-8 only, and a depth limit counted before the
decoder runs (so it holds on any thread, whatever stack it has left)."""

from __future__ import annotations

import json
import threading

import pytest

from backfill.platform import strict_json
from backfill.platform.strict_json import MAX_DEPTH, NotFinite, TooDeep


def arrays(levels: int) -> bytes:
    return b"[" * levels + b"]" * levels


def objects(levels: int) -> bytes:
    return b'{"a":' * (levels - 1) + b"{}" + b"}" * (levels - 1)


@pytest.mark.parametrize("make", [arrays, objects])
def test_the_limit_is_exact(make) -> None:  # type: ignore[no-untyped-def]
    assert strict_json.loads(make(MAX_DEPTH)) is not None
    with pytest.raises(TooDeep):
        strict_json.loads(make(MAX_DEPTH + 1))


@pytest.mark.parametrize(
    "data",
    [
        b"[" * 100_000,  # never closed
        b"]" * 10 + b"[" * 200,
        b"[" * 200 + b"]" * 10,
        b'{"a": [' * 300,
        b"[" * 200 + b"}" * 200,
    ],
)
def test_unbalanced_deep_input_is_refused_before_decoding(data: bytes) -> None:
    with pytest.raises(TooDeep):
        strict_json.loads(data)


def test_brackets_inside_strings_are_text() -> None:
    text = json.dumps({"a": "[" * 1000 + '\\"{' * 500}).encode()
    assert strict_json.loads(text)["a"].startswith("[[[")
    many_shallow = json.dumps([[i] for i in range(10_000)]).encode()
    assert len(strict_json.loads(many_shallow)) == 10_000


def test_the_limit_holds_on_a_thread_with_a_small_stack() -> None:
    """Deep input is refused by counting, not by running out of stack."""
    results: list[object] = []
    threading.stack_size(256 * 1024)
    try:
        t = threading.Thread(
            target=lambda: results.append(_refusal(arrays(100_000)) and _refusal(objects(50_000)))
        )
        t.start()
        t.join()
    finally:
        threading.stack_size(0)
    assert results == [True]


def _refusal(data: bytes) -> bool:
    try:
        strict_json.loads(data)
    except TooDeep:
        return True
    return False


@pytest.mark.parametrize(
    "data",
    [
        b"[NaN]",
        b"[Infinity]",
        b"[-Infinity]",
        b"[1e999]",
        b"[-1E+400]",
        b"[1" + b"0" * 400 + b".0]",
    ],
)
def test_numbers_that_are_not_finite_are_refused(data: bytes) -> None:
    with pytest.raises(NotFinite):
        strict_json.loads(data)


def test_a_huge_number_may_be_read_from_a_text_kept_as_it_came() -> None:
    assert strict_json.loads(b"[1e999]", finite=False) == [float("inf")]
    with pytest.raises(NotFinite):
        strict_json.loads(b"[NaN]", finite=False)


def test_ordinary_numbers_and_lookalikes_in_strings() -> None:
    assert strict_json.loads(b'[1e308, 1e-999, 12, "1e999", "' + b"9" * 400 + b'"]')[:3] == [
        1e308,
        0.0,
        12,
    ]


@pytest.mark.parametrize("data", [b"\xff", "[1]".encode("utf-16"), b"{nope", b"{} {}", b""])
def test_everything_refused_is_a_value_error_with_a_reason(data: bytes) -> None:
    with pytest.raises(ValueError) as err:
        strict_json.loads(data)
    assert strict_json.describe(err.value)


def test_unique_keys_refuses_a_key_twice_at_any_depth() -> None:
    from backfill.platform.strict_json import DuplicateKey

    assert strict_json.loads(b'{"a":1,"a":2}') == {"a": 2}  # upstream answers: only looked at
    for text in (b'{"a":1,"a":2}', b'{"x":[{"b":1,"c":2,"b":3}]}', b'{"a":1e999,"a":1}'):
        with pytest.raises(DuplicateKey):
            strict_json.loads(text, unique_keys=True, finite=False)
    assert strict_json.loads(b'{"a":{"a":1},"b":[{"a":2}]}', unique_keys=True) == {
        "a": {"a": 1},
        "b": [{"a": 2}],
    }
