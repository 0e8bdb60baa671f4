"""A gate defined only here runs in the real RouteSchedulerWorkflow on the dev server, with no
change to the scheduler: its state is fed by its own signal, from its own reader activity and
from the test, it closes the route with its own detail, and its reader starts with demand and is
cancelled when the demand goes (docs/decisions/0040)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from pydantic import BaseModel
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from backfill.platform.messages import Demand
from backfill.routes.gates import (
    GateAnswer,
    GateContext,
    GateEntry,
    GateSignal,
    GateState,
    Reader,
    registered,
)
from backfill.routes.gates.server_load import LoadVerdict, WatchLoadInput
from backfill.routes.reasons import WaitReason
from backfill.routes.settings import RouteSettings
from tests.polling import poll_until
from tests.workflows.events import require, signaled
from tests.workflows.seat_route import seat_route
from workflows.scheduler import RouteSchedulerWorkflow

pytestmark = pytest.mark.asyncio(loop_scope="session")


class Hold(BaseModel):
    """The test gate's signal: hold the route (or let it go), and who says so."""

    on: bool
    by: str


class HoldWatch(BaseModel):
    """The test gate's reader's input."""

    route_id: str


HOLD_STATE = GateState(key="test_hold", type=Hold | None, initial=lambda: None)


def decide(_: object, ctx: GateContext) -> GateAnswer:
    hold: Hold | None = ctx.state_of(HOLD_STATE)
    if hold is not None and hold.on:
        return GateAnswer(False, WaitReason.BUSY, detail=f"held by {hold.by}")
    return GateAnswer(True)


def hold_gate(reader: str) -> GateEntry[Any]:
    return GateEntry(
        name="test_hold",
        label="Test hold",
        decide=decide,
        state=HOLD_STATE,
        signals=(GateSignal("test_hold", Hold, lambda _, h, now: h),),
        reader=Reader(reader, lambda route_id, _: HoldWatch(route_id=route_id)),
    )


async def test_a_gate_defined_in_a_test_runs_in_the_scheduler(temporal_client: Client) -> None:
    started: list[str] = []
    cancelled: list[str] = []

    @activity.defn(name="watch_test_hold")
    async def watch_test_hold(watch: HoldWatch) -> None:
        """Signals the hold once, then reads on until cancelled (as a real reader would)."""
        started.append(watch.route_id)
        info = activity.info()
        assert info.workflow_id is not None
        handle = temporal_client.get_workflow_handle(info.workflow_id)
        await handle.signal("test_hold", Hold(on=True, by="its reader"))
        try:
            while True:
                activity.heartbeat()
                await asyncio.sleep(0.5)
        except asyncio.CancelledError:
            cancelled.append(watch.route_id)
            raise

    settings = RouteSettings(max_concurrent_lines=4)
    with registered(hold_gate("watch_test_hold")):
        async with seat_route(temporal_client, "hold", settings, [watch_test_hold]) as r:
            scheduler = r.scheduler

            async def status() -> Any:
                return await scheduler.query(RouteSchedulerWorkflow.status, time.time())

            # The reader starts with the demand and closes the route by its signal.
            held = await poll_until(
                status, lambda s: s.state == "paused", timeout=30, what="held by the reader"
            )
            assert (held.reason, held.reason_detail) == (WaitReason.BUSY, "held by its reader")
            assert started == [scheduler.id.removeprefix("route-scheduler:")]  # its input
            await poll_until(r.allotments, lambda a: a[-1:] == [0], timeout=30, what="none")

            # The test's own signal lets it go: the route's cap again.
            await scheduler.signal("test_hold", Hold(on=False, by="the test"))
            await poll_until(r.allotments, lambda a: a[-1:] == [4], timeout=30, what="all 4")
            assert (await status()).state == "open"

            # No demand: the reader is cancelled.
            await scheduler.signal(
                RouteSchedulerWorkflow.demand, Demand(batch_id=r.batch.id, workspace="w", wanted=0)
            )
            await poll_until(lambda: len(cancelled), lambda n: n == 1, timeout=30, what="cancel")

            history = await scheduler.fetch_history()
            require(
                history,
                EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED,
                "the reader's signal",
                signaled("test_hold"),
            )
            scheduled = [
                e.activity_task_scheduled_event_attributes.activity_type.name
                for e in history.events
                if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
            ]
            assert scheduled == ["watch_test_hold"]
            assert len(started) == 1


async def test_a_gate_with_settings_must_be_a_line_of_the_registry() -> None:
    class Setting(BaseModel):
        x: int

    entry = GateEntry(name="test_set", label="Test", decide=decide, model=Setting)
    with pytest.raises(ValueError, match="has settings"), registered(entry):
        pass
    with registered(hold_gate("r")), pytest.raises(ValueError, match="registered already"):
        with registered(hold_gate("r")):
            pass


async def test_the_server_load_gate_runs_its_reader_and_takes_its_verdicts(
    temporal_client: Client,
) -> None:
    """The built-in server-load gate through the same registry: its reader activity starts with
    the route id and the setting, and its `server_load` signal closes and opens the route."""
    inputs: list[WatchLoadInput] = []

    @activity.defn(name="watch_server_load")
    async def watch_server_load(watch: WatchLoadInput) -> None:
        inputs.append(watch)
        workflow_id = activity.info().workflow_id
        assert workflow_id is not None
        handle = temporal_client.get_workflow_handle(workflow_id)
        await handle.signal(
            "server_load",
            LoadVerdict(state="busy", detail="waiting requests 5 > 0"),
        )
        while True:
            activity.heartbeat()
            await asyncio.sleep(0.5)

    url = "http://127.0.0.1:9/metrics"
    settings = RouteSettings(
        max_concurrent_lines=3, server_load={"metrics_url": url, "max_waiting": 0}
    )
    async with seat_route(temporal_client, "load", settings, [watch_server_load]) as r:
        busy = await poll_until(
            lambda: r.scheduler.query(RouteSchedulerWorkflow.status, time.time()),
            lambda s: s.reason == WaitReason.BUSY,
            timeout=30,
            what="busy by the watcher's verdict",
        )
        assert busy.reason_detail == "waiting requests 5 > 0"
        [watch] = inputs
        assert watch.route_id == r.scheduler.id.removeprefix("route-scheduler:")
        assert watch.settings.metrics_url == url
        await r.scheduler.signal("server_load", LoadVerdict(state="open"))
        await poll_until(r.allotments, lambda a: a[-1:] == [3], timeout=30, what="all 3")
