"""The management API's route status is the scheduler's status, declared once: the api adds its
own counts to the scheduler's fields, never reads the model server's `/metrics` itself, and answers
`backoff_until` in whole unix seconds whatever the scheduler holds.

A real HTTP metrics server on loopback (counting its scrapes), the real app in FastAPI's
TestClient, and a Temporal client whose scheduler answers a given status (no batch on the route,
so no other workflow is asked)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.schemas import SchedulingStatus
from backfill.platform.config import ApiKeyConfig, ModelConfig, RouteConfig, Settings, hash_key
from backfill.routes.gates import registry
from backfill.routes.gates.base import Gate
from backfill.routes.gates.server_load import LoadReading, LoadVerdict
from backfill.routes.settings import RouteSettings
from backfill.routes.status import RouteState, SchedulerStatus

ADMIN = "sk-admin"
METRICS = (Path(__file__).parents[1] / "fixtures" / "server-metrics" / "metrics-1.txt").read_bytes()


@pytest.fixture
def model_server() -> Iterator[tuple[str, list[str]]]:
    """A model server's `/metrics` on loopback: its base URL and the paths asked of it."""
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(METRICS)))
            self.end_headers()
            self.wfile.write(METRICS)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", asked
    finally:
        server.shutdown()
        server.server_close()


class _Scheduler:
    """A Temporal client whose one workflow, the route's scheduler, answers `status`."""

    def __init__(self, status: SchedulerStatus) -> None:
        self.status = status

    def get_workflow_handle_for(self, *args: object, **kwargs: object) -> _Scheduler:
        return self

    async def query(self, *args: object, **kwargs: object) -> SchedulerStatus:
        return self.status


def test_the_route_status_shows_what_the_scheduler_read_and_reads_no_metrics(
    tmp_path: Path, model_server: tuple[str, list[str]]
) -> None:
    base, asked = model_server
    settings = Settings(
        data_dir=tmp_path,
        api_keys=[
            ApiKeyConfig(sha256=hash_key(ADMIN), workspace="ops", name="ops", role="platform_admin")
        ],
        models=[ModelConfig(id="m", routes=[RouteConfig(id="gpu", base_url=f"{base}/v1")])],
    )
    judged = LoadReading(waiting=3, running=1, kv_cache_percent=40.0, read_at=1_765_000_000)
    status = SchedulerStatus(
        route_id="gpu",
        settings=RouteSettings.model_validate(
            {"server_load": {"metrics_url": f"{base}/metrics", "max_waiting": 4}}
        ),
        limit=2,
        allotted=0,
        held=0,
        queued_lines=0,
        batches=[],
        state="paused",
        reason="Rate limited · backing off",
        backoff_until=1_765_000_010.75,
        server_load=judged,
    )
    app = create_app(settings, client=_Scheduler(status))  # type: ignore[arg-type]
    with TestClient(app, headers={"Authorization": f"Bearer {ADMIN}"}) as http:
        r = http.get("/api/v1/platform/deployments/gpu/batch-scheduling")
    assert r.status_code == 200, r.text
    shown = r.json()["status"]
    assert shown["server_load"] == judged.model_dump(mode="json")  # the scheduler's, as read
    assert asked == []  # no second scrape of the model server per admin request
    assert shown["backoff_until"] == 1_765_000_010  # whole unix seconds
    assert isinstance(shown["backoff_until"], int)


def test_the_api_s_status_declares_none_of_the_scheduler_s_fields_again() -> None:
    """Every field the scheduler's status and the api's share is `RouteState`'s, declared once
    (the gates' fields among them): the api's model adds only its own."""
    shared = set(SchedulerStatus.model_fields) & set(SchedulingStatus.model_fields)
    assert shared == set(RouteState.model_fields)
    assert {"backoff_until", "server_load"} <= shared
    schema = SchedulingStatus.model_json_schema(mode="serialization")
    backoff = schema["properties"]["backoff_until"]["anyOf"]
    assert {"type": "integer"} in backoff and {"type": "number"} not in backoff


def test_the_scheduler_s_status_carries_the_reading_its_load_gate_judged() -> None:
    """What the api shows is the scheduler's: the server load gate's status is the reading of
    its last verdict (null before the first, and once the setting is switched off)."""
    judged = LoadReading(waiting=9, running=2, read_at=1_765_000_000)
    busy = LoadVerdict(state="busy", detail="waiting requests 9 > 4", reading=judged)
    states = {"load": busy.model_dump()}
    assert registry.status_fields(states, Gate(False), 1_765_000_001)["server_load"] == judged
    assert registry.status_fields({}, Gate(True), 1_765_000_001)["server_load"] is None
    on = RouteSettings.model_validate(
        {"server_load": {"metrics_url": "http://127.0.0.1:9/metrics", "max_waiting": 4}}
    )
    registry.on_settings_change(on, RouteSettings(), states)
    assert registry.status_fields(states, Gate(True), 1_765_000_001)["server_load"] is None


def test_a_back_off_end_is_whole_unix_seconds_from_any_scheduler() -> None:
    """The back-off gate keeps fractions (and a worker of an earlier version answered them):
    the status holds the second, as the api always answered."""
    status = SchedulerStatus(
        route_id="r",
        settings=RouteSettings(),
        limit=2,
        allotted=0,
        held=0,
        queued_lines=0,
        batches=[],
        backoff_until=1_765_000_010.75,
    )
    assert status.backoff_until == 1_765_000_010
    assert SchedulerStatus.model_validate_json(status.model_dump_json()) == status
    shown = SchedulingStatus(
        **{name: getattr(status, name) for name in RouteState.model_fields}, running_lines=0
    )
    assert shown.model_dump(mode="json")["backoff_until"] == 1_765_000_010
