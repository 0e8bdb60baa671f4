"""`backfill dev`'s routes (issue 48): the simulator serves the routes that point at its port and
only those; a route at another port of this machine needs a model server already answering
there, and when none does dev refuses, saying what to do; each hint, followed, starts. Taken
ports are named with the flags that move them to free ones."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from backfill.operations.doctor import route_finding
from backfill.platform.config import ModelConfig, RouteConfig, Settings
from tools.dev import routes, runner
from tools.dev.procs import free_port


def settings(*routes_of: tuple[str, str]) -> Settings:
    """One model per (model id, base_url)."""
    return Settings(
        models=[
            ModelConfig(id=model, routes=[RouteConfig(id=f"{model}-route", base_url=url)])
            for model, url in routes_of
        ]
    )


@pytest.fixture
def listening() -> Iterator[int]:
    """A loopback port held by an HTTP server that is not a model server (404 to everything)."""
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


async def test_the_simulator_serves_the_routes_at_its_port_only() -> None:
    sim = free_port()
    plan = await routes.plan(
        settings(("demo", f"http://127.0.0.1:{sim}/v1"), ("other", "https://api.openai.com/v1")),
        sim,
    )
    assert plan.sim_models == ["demo"] and plan.findings == []
    assert (await routes.plan(settings(("x", "https://api.openai.com/v1")), sim)).sim_models == []


async def test_a_local_route_without_a_server_is_refused_with_hints_that_work() -> None:
    sim, nothing = free_port(), free_port()
    plan = await routes.plan(settings(("tiny", f"http://127.0.0.1:{nothing}/v1")), sim)
    assert plan.sim_models == []
    [refused] = plan.refused
    text = "\n".join(refused.lines())
    assert f"route tiny-route: http://127.0.0.1:{nothing}/v1/models does not answer" in text
    hint = f'base_url = "http://127.0.0.1:{sim}/v1"'
    assert hint in text
    # Followed, the hint starts: the simulator serves the route.
    followed = await routes.plan(settings(("tiny", f"http://127.0.0.1:{sim}/v1")), sim)
    assert followed.refused == [] and followed.sim_models == ["tiny"]


async def test_a_taken_simulator_port_is_checked_as_a_model_server(listening: int) -> None:
    # Something that is not a model server holds the simulator's port the route names.
    plan = await routes.plan(settings(("demo", f"http://127.0.0.1:{listening}/v1")), listening)
    assert plan.sim_models == []
    [refused] = plan.refused
    assert "--sim-port N" in refused.fix and "stop it or move the simulator" in refused.fix


def test_taken_ports_are_named_with_the_flags_that_move_them(listening: int) -> None:
    free = free_port()
    said = runner.busy_ports({"--api-port": ("api", listening), "--ui-port": ("UI", free)})
    assert said is not None
    assert f"api 127.0.0.1:{listening}" in said and "UI" not in said
    moved = int(said.split("--api-port ")[1].split()[0].rstrip(")"))
    assert runner.busy_ports({"--api-port": ("api", moved)}) is None
    assert runner.busy_ports({"--ui-port": ("UI", free)}) is None


def test_an_existing_temporal_comes_from_the_flag_or_temporal_address(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TEMPORAL_ADDRESS", raising=False)
    assert runner.existing_temporal(Settings(), None) is None
    assert runner.existing_temporal(Settings(), "10.0.0.5:7233") == "10.0.0.5:7233"
    monkeypatch.setenv("TEMPORAL_ADDRESS", "127.0.0.1:7299")
    assert runner.existing_temporal(Settings(), None) == "127.0.0.1:7299"


def models_answer(body: object, status: int = 200) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.MockTransport(lambda request: httpx.Response(status, json=body))
    )


async def test_the_doctor_checks_the_route_s_model_is_served() -> None:
    listing = {"object": "list", "data": [{"id": "demo"}, {"id": "demo-lora"}]}
    async with models_answer(listing) as http:
        ok = await route_finding(http, "demo", "r", "http://h/v1", None)
        missing = await route_finding(http, "ghost", "r", "http://h/v1", None)
    assert ok.level == "ok" and ok.said == "http://h/v1 serves demo"
    assert missing.level == "fail"
    assert "does not serve model ghost (it serves: demo, demo-lora)" in missing.said
    assert "--served-model-name ghost" in missing.fix
    async with models_answer({"detail": "Not Found"}, 404) as http:
        unknown = await route_finding(http, "demo", "r", "http://h/v1", None)
    assert unknown.level == "warn" and "without a model list" in unknown.said


def test_refused_routes_start_nothing(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TEMPORAL_ADDRESS", raising=False)
    started: list[object] = []
    monkeypatch.setattr(runner.DevServer, "start", lambda self: started.append(self))
    nothing = free_port()
    rc = runner.run(
        settings(("tiny", f"http://127.0.0.1:{nothing}/v1")),
        temporal_port=free_port(),
        ui_port=free_port(),
        sim_port=free_port(),
        api_port=free_port(),
        worker_metrics_port=free_port(),
    )
    assert rc == 2 and started == []
    err = capsys.readouterr().err
    assert "refusing to start" in err and f"127.0.0.1:{nothing}/v1/models does not answer" in err
