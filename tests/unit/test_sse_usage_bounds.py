"""The live proxy's SSE usage reader is bounded (issue 40): an upstream stream that never ends
a line holds at most `MAX_EVENT_BYTES`, the bytes already held are not copied again on each
chunk, and usage is still read from events split over chunks or after an oversized line."""

from __future__ import annotations

import json
import tracemalloc

import pytest

from api.live import usage_counts as live_usage
from api.live.usage_counts import UsageReader

CAP = 64 * 1024


@pytest.fixture(autouse=True)
def _small_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(live_usage, "MAX_EVENT_BYTES", CAP, raising=False)


def _usage_event(prompt: int, completion: int) -> bytes:
    event = {"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion}}
    return b"data: " + json.dumps(event).encode() + b"\n\n"


def test_a_stream_that_never_ends_a_line_holds_at_most_the_cap() -> None:
    reader = UsageReader("text/event-stream")
    chunk = b"x" * 4096
    tracemalloc.start()
    try:
        for _ in range(2048):  # 8 MiB without a newline
            reader.feed(chunk)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * CAP, peak
    # The oversized line ends; the stream's usage after it is read.
    reader.feed(b"\n" + _usage_event(7, 3))
    assert reader.tokens() == (7, 3)


def test_usage_split_over_many_small_chunks_is_read() -> None:
    reader = UsageReader("text/event-stream")
    data = b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n' + _usage_event(11, 2)
    for i in range(len(data)):
        reader.feed(data[i : i + 1])
    reader.feed(b"data: [DONE]\n\n")
    assert reader.tokens() == (11, 2)


def test_a_last_event_without_its_newline_still_counts() -> None:
    reader = UsageReader("text/event-stream")
    reader.feed(_usage_event(5, 1).rstrip(b"\n"))
    assert reader.tokens() == (5, 1)


def test_an_oversized_usage_line_counts_no_tokens_and_nothing_after_it_is_lost() -> None:
    reader = UsageReader("text/event-stream")
    big = b'data: {"usage": {"prompt_tokens": 99, "completion_tokens": 99}, "pad": "'
    reader.feed(big + b"y" * (2 * CAP) + b'"}\n\n')
    assert reader.tokens() == (0, 0)
    reader.feed(_usage_event(4, 4))
    assert reader.tokens() == (4, 4)
