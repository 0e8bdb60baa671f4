"""The api's one reader of each route scheduler: a young reading is reused, asks during a query
share it, a missing scheduler is a reading, a failure is not kept."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from temporalio.service import RPCError, RPCStatusCode

from api.routes.poller import RoutePoller
from backfill.platform.messages import LiveGateView


class Scheduler:
    """A route scheduler's handle whose `live_gate` answers when the test lets it."""

    def __init__(self) -> None:
        self.queries = 0
        self.answer: LiveGateView | BaseException = LiveGateView(threshold=3)
        self.gate = asyncio.Event()
        self.gate.set()

    async def query(self, *_: Any, **__: Any) -> Any:
        self.queries += 1
        await self.gate.wait()
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


class Link:
    def __init__(self) -> None:
        self.scheduler = Scheduler()
        self.routes: list[str] = []

    def client(self) -> Link:
        return self

    def get_workflow_handle_for(self, _: Any, workflow_id: str) -> Scheduler:
        self.routes.append(workflow_id)
        return self.scheduler


async def test_asks_during_a_query_share_it_and_a_young_reading_is_reused() -> None:
    link = Link()
    poller = RoutePoller(link)  # type: ignore[arg-type]
    link.scheduler.gate.clear()
    asks = [asyncio.create_task(poller.live_gate("r1", 5.0)) for _ in range(3)]
    await asyncio.sleep(0.01)
    assert link.scheduler.queries == 1  # three loops asking at once: one query
    link.scheduler.gate.set()
    views = await asyncio.gather(*asks)
    assert [v.threshold for v in views] == [3, 3, 3]
    assert (await poller.live_gate("r1", 5.0)).threshold == 3
    assert link.scheduler.queries == 1  # young enough for a 5 s asker
    await poller.live_gate("r1", 0.0)
    assert link.scheduler.queries == 2  # not for one that wants it now
    poller.forget("r1")
    await poller.live_gate("r1", 5.0)
    assert link.scheduler.queries == 3  # forgotten after a signal: read again
    assert poller.queries == 3
    assert set(link.routes) == {"route-scheduler:r1"}


async def test_a_missing_scheduler_is_a_reading_and_a_failure_is_not_kept() -> None:
    link = Link()
    poller = RoutePoller(link)  # type: ignore[arg-type]
    link.scheduler.answer = RPCError("not found", RPCStatusCode.NOT_FOUND, b"")
    assert (await poller.live_gate("r1", 5.0)).threshold is None
    assert await poller.status("r2", 5.0) is None
    link.scheduler.answer = RPCError("unavailable", RPCStatusCode.UNAVAILABLE, b"")
    poller.forget("r1")
    with pytest.raises(RPCError):
        await poller.live_gate("r1", 5.0)
    link.scheduler.answer = LiveGateView(threshold=7)
    assert (await poller.live_gate("r1", 5.0)).threshold == 7  # tried again at once


async def test_an_asker_cancelled_leaves_the_query_to_the_others_and_close_ends_it() -> None:
    link = Link()
    poller = RoutePoller(link)  # type: ignore[arg-type]
    link.scheduler.gate.clear()
    first = asyncio.create_task(poller.live_gate("r1", 5.0))
    second = asyncio.create_task(poller.live_gate("r1", 5.0))
    await asyncio.sleep(0.01)
    first.cancel()
    await asyncio.sleep(0.01)
    link.scheduler.gate.set()
    assert (await second).threshold == 3
    assert link.scheduler.queries == 1
    link.scheduler.gate.clear()
    hanging = asyncio.create_task(poller.live_gate("r1", 0.0))
    await asyncio.sleep(0.01)
    await poller.close()  # Temporal hangs; the api stops: nothing is left running
    with pytest.raises(asyncio.CancelledError):
        await hanging
