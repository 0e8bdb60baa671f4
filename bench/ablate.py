"""What-if switches for the backfill phase: remove one per-line cost in THIS process only.

They monkeypatch the activity side for the duration of one phase (the project's files are not
touched) so a run can say how much of the gap to the bare baseline each cost explains. Numbers
measured with an ablation are not backfill's throughput: they are estimates of what a change
would buy.

- `heartbeat`: `run_line` sends no heartbeat (it used to send one per line at its start, an extra
  RPC and an extra mutable-state write on the server per line).
- `fsync`: `FileStore.commit_result` writes and links its record without `os.fsync` (which today
  blocks the worker's event loop once per line).
- `http`: `run_line` gets a canned 200 answer without any HTTP request (httpx and the
  simulator drop out; the store and Temporal paths stay), after the simulator's latency.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

ABLATIONS = ("heartbeat", "fsync", "http")


class _OsWithoutFsync:
    """`os` for backfill.files.local, with fsync a no-op."""

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    @staticmethod
    def fsync(fd: int) -> None:
        return None


@contextlib.asynccontextmanager
async def _no_heartbeat() -> AsyncIterator[None]:
    yield


async def _canned_send(
    self: Any, route: Any, input: Any, request: dict[str, Any], line_no: int, rid: str
) -> Any:
    """`LineActivities._send` without the HTTP request: the simulator's answer, built the way
    `_send` builds a real one (`activities.lines.answers.http_answer`), after the simulator's
    latency (`CANNED_LATENCY_S`), so lines still take as long as with the upstream."""
    from activities.lines.answers import http_answer

    if CANNED_LATENCY_S:
        await asyncio.sleep(CANNED_LATENCY_S)
    body = {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "model": request["body"].get("model"),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "ok"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
    data = json.dumps(body).encode()
    return http_answer(request["custom_id"], line_no, 200, rid, "application/json", data)


CANNED_LATENCY_S = 0.0
"""How long the canned answer waits (the bench sets it to the simulator's latency)."""


@contextlib.contextmanager
def ablated(names: list[str], latency_s: float = 0.0) -> Iterator[None]:
    """Apply the named ablations for the duration of the block, then restore everything.
    `latency_s`: how long the canned answer of `http` waits (the simulator's latency)."""
    import activities.lines.run_line as lines_mod
    import backfill.files.local as store_mod

    unknown = set(names) - set(ABLATIONS)
    if unknown:
        raise ValueError(f"unknown ablation(s): {sorted(unknown)}; known: {ABLATIONS}")
    saved: list[tuple[Any, str, Any]] = []

    def patch(obj: Any, attr: str, value: Any) -> None:
        saved.append((obj, attr, getattr(obj, attr)))
        setattr(obj, attr, value)

    try:
        if "heartbeat" in names:
            patch(lines_mod, "heartbeating", _no_heartbeat)
        if "fsync" in names:
            patch(store_mod, "os", _OsWithoutFsync())
        if "http" in names:
            patch(lines_mod.LineActivities, "_send", _canned_send)
            patch(sys.modules[__name__], "CANNED_LATENCY_S", latency_s)
        yield
    finally:
        for obj, attr, value in reversed(saved):
            setattr(obj, attr, value)
