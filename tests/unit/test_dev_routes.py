"""`backfill dev` on moved ports never sends its lines to another stack's simulator (issue 39):
with a route on this machine pointing elsewhere it refuses to start, saying which route and what
to set; it starts nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from backfill.config import ModelConfig, RouteConfig, Settings
from tools.dev import runner


def settings(*base_urls: str) -> Settings:
    routes = [RouteConfig(id=f"r{i}", base_url=url) for i, url in enumerate(base_urls)]
    return Settings(models=[ModelConfig(id="demo", routes=routes)])


def test_a_route_at_another_local_port_is_refused(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)  # the data dir, were anything made
    started: list[object] = []
    monkeypatch.setattr(runner.DevServer, "start", lambda self: started.append(self))
    rc = runner.run(settings("http://127.0.0.1:8100/v1"), sim_port=8200)
    assert rc == 2 and started == []
    err = capsys.readouterr().err
    assert "route r0 points at http://127.0.0.1:8100/v1" in err
    assert 'base_url = "http://127.0.0.1:8200/v1"' in err and "BACKFILL_CONFIG" in err
    assert "--sim-port 8100" in err


@pytest.mark.parametrize(
    "urls",
    [
        ("http://127.0.0.1:8200/v1",),
        ("http://localhost:8200/v1", "http://127.0.0.1:9000/v1"),  # a second local server too
        ("https://api.openai.com/v1",),  # nothing on this machine: nothing to mix up
    ],
)
def test_routes_that_cannot_reach_another_simulator_pass(urls: tuple[str, ...]) -> None:
    assert runner.misrouted(settings(*urls), 8200) is None
