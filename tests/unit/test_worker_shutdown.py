"""What makes a worker's graceful stop possible: its bound, its signals, and the one activity
that never ends by itself (the server-load watcher) ending when the worker stops."""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.server_load import ServerLoadActivities
from backfill.platform.config import Limits, Settings
from backfill.routes.gates.server_load import LoadReading, ServerLoadSettings, WatchLoadInput
from worker.main import StopSignals


def test_grace_defaults_to_the_line_timeout() -> None:
    assert Settings(limits=Limits(line_timeout_seconds=42)).shutdown_grace_seconds == 42


def test_grace_setting_wins_and_zero_means_cancel_at_once() -> None:
    s = Settings(limits=Limits(line_timeout_seconds=42), worker_shutdown_grace_seconds=0)
    assert s.shutdown_grace_seconds == 0


def test_grace_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BACKFILL_WORKER_SHUTDOWN_GRACE_SECONDS", "90")
    assert Settings().shutdown_grace_seconds == 90


def test_first_signal_asks_to_stop_second_exits(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    exits: list[int] = []
    monkeypatch.setattr("worker.main.os._exit", exits.append)
    signals = StopSignals(grace_seconds=600)
    with caplog.at_level(logging.INFO, logger="worker.main"):
        signals.received(signal.SIGTERM)
        assert signals.requested.is_set() and exits == []
        assert "600 s" in caplog.text
        signals.received(signal.SIGTERM)
    assert exits == [128 + signal.SIGTERM]


class SteadyReader:
    async def read(self, url: str) -> LoadReading:
        return LoadReading(read_at=0, waiting=0, running=0, kv_cache_percent=1)


class Handle:
    def __init__(self) -> None:
        self.signals: list[Any] = []

    async def signal(self, _method: Any, arg: Any) -> None:
        self.signals.append(arg)


class FakeClient:
    def __init__(self) -> None:
        self.handle = Handle()

    def get_workflow_handle_for(self, *_: Any) -> Handle:
        return self.handle


async def test_watcher_fails_retryably_when_its_worker_stops() -> None:
    client = FakeClient()
    acts = ServerLoadActivities(SteadyReader(), client)  # type: ignore[arg-type]
    env = ActivityEnvironment()
    watch = WatchLoadInput(
        route_id="r",
        settings=ServerLoadSettings(metrics_url="http://10.0.0.5:8000/metrics", max_waiting=4),
    )
    task = asyncio.ensure_future(env.run(acts.watch_server_load, watch))
    while not client.handle.signals:  # it read the server once and reported
        await asyncio.sleep(0.01)
    assert not task.done()
    env.worker_shutdown()
    with pytest.raises(ApplicationError) as err:
        await asyncio.wait_for(task, 5)
    assert err.value.type == "WorkerShutdown" and not err.value.non_retryable
