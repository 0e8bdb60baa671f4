"""`quick_query` bounds the whole call, not only each RPC: the SDK sends a query again when its
deadline passes, which let one unanswered query (no worker) take 5 to 9 s."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any

import pytest
from temporalio.service import RPCError, RPCStatusCode

from api.batches import history_view


class StuckHandle:
    """A workflow handle whose query never returns (as with no worker and the SDK retrying)."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    async def query(self, query: Any, *args: Any, rpc_timeout: timedelta) -> Any:
        self.calls.append((query, args, rpc_timeout))
        await asyncio.Event().wait()


class AnsweringHandle:
    async def query(self, query: Any, *args: Any, rpc_timeout: timedelta) -> Any:
        return ("answer", args)


async def test_an_unanswered_query_ends_in_a_deadline_error_within_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(history_view, "QUICK_QUERY", timedelta(seconds=0.2))
    monkeypatch.setattr(history_view, "QUICK_QUERY_GRACE", 0.1)
    handle = StuckHandle()
    started = time.monotonic()
    with pytest.raises(RPCError) as err:
        await history_view.quick_query(handle, "status", 1.5)  # type: ignore[arg-type]
    took = time.monotonic() - started
    assert err.value.status == RPCStatusCode.DEADLINE_EXCEEDED
    assert 0.3 <= took < 2.0, took
    assert handle.calls == [("status", (1.5,), timedelta(seconds=0.2))]


async def test_an_answer_is_returned_as_is() -> None:
    got: Any = await history_view.quick_query(AnsweringHandle(), "status", 7)  # type: ignore[arg-type]
    assert got == ("answer", (7,))
