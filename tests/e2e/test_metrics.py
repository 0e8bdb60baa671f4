"""The api's and the worker's `/metrics` on the real stack: route reasons and line counts read
from the workflows, the Temporal SDK's own metrics on the worker's port, live request latency on
the api, and the stalled-batch clock (a hung upstream stalls, a cap held by another batch does
not)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import TemporalServer
from tests.e2e.stack import Stack, auth, submit
from tests.polling import poll_until
from tools.sim import SimConfig, SimFault

ADMIN = "sk-test-admin"
FAST_EXPORT = {"BACKFILL_METRICS_POLL_SECONDS": "0.3"}

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(http: httpx.AsyncClient, url: str) -> Samples:
    """The samples at `url` (an auditor key is sent: the api's `/metrics` needs one)."""
    resp = await http.get(url, headers=auth("sk-test-auditor"))
    assert resp.status_code == 200, resp.text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(resp.text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def worker_url(stack: Stack, i: int = 0) -> str:
    return f"http://127.0.0.1:{stack.worker_metrics_ports[i]}/metrics"


async def put_settings(stack: Stack, http: httpx.AsyncClient, doc: dict[str, Any]) -> None:
    url = f"{stack.api_url}/api/v1/platform/deployments/{stack.route_id}/batch-scheduling"
    resp = await http.put(url, json=doc, headers=auth(ADMIN))
    assert resp.status_code == 200, resp.text


async def test_a_closed_gate_shows_on_the_worker_and_live_latency_on_the_api(
    tmp_path: Path, dev_server: TemporalServer
) -> None:
    sim = SimConfig(model_names=[], latency_ms=400, stream_token_delay_ms=500)
    logs = {"BACKFILL_LOG_FORMAT": "json", "BACKFILL_LOG_LEVEL": "INFO"}
    stack = Stack(tmp_path, dev_server.address, cap=2, sim=sim, extra_env=FAST_EXPORT | logs)
    route = stack.route_id
    async with stack.running(), httpx.AsyncClient(timeout=30) as http:
        await put_settings(
            stack,
            http,
            {"max_concurrent_lines": 2, "yield_to_live_traffic": {"pause_at_in_flight": 1}},
        )
        batch_id = await submit(stack, 60)
        running = await poll_until(
            lambda: scrape(http, worker_url(stack)),
            lambda m: (
                (value(m, "gateway_batch_route_lines", provider=route, state="running") or 0) >= 1
            ),
            timeout=60,
            what="running lines in gateway_batch_route_lines",
            interval=0.2,
        )
        # The Temporal SDK's own metrics, on the same port.
        assert any(name.startswith("temporal_") for name, _ in running), sorted(running)[:20]
        assert value(running, "gateway_batch_route_lines", provider=route, state="waiting")

        stream = await stack.client().chat.completions.create(
            model="demo", messages=[{"role": "user", "content": "a long answer"}], stream=True
        )
        await stream.__anext__()  # in flight at the gateway: the live gate closes
        closed = await poll_until(
            lambda: scrape(http, worker_url(stack)),
            lambda m: (
                value(m, "gateway_batch_paused_routes", reason="Yielding to live traffic") == 1
            ),
            timeout=30,
            what="the route counted under its reason",
            interval=0.2,
        )
        waiting = value(closed, "gateway_batch_route_lines", provider=route, state="waiting")
        assert waiting is not None and waiting > 0
        assert value(closed, "gateway_batch_route_pauses_total", reason="Yielding to live traffic")
        api = await scrape(http, f"{stack.api_url}/metrics")
        assert value(api, "gateway_live_in_flight", route=route) == 1
        assert (
            value(api, "gateway_live_request_seconds_count", route=route, phase="ttft") or 0
        ) >= 1
        await stream.close()
        await poll_until(
            lambda: scrape(http, f"{stack.api_url}/metrics"),
            lambda m: (
                value(m, "gateway_live_request_seconds_count", route=route, phase="total") == 1
            ),
            timeout=10,
            what="the finished live request's total latency",
        )
        # Lines that finished were counted by outcome on the worker.
        done = await scrape(http, worker_url(stack))
        assert (
            value(done, "gateway_batch_line_outcomes_total", provider=route, outcome="2xx") or 0
        ) >= 1
        assert (value(done, "gateway_batch_line_seconds_count", provider=route) or 0) >= 1
        # JSON logs: one line per batch state change, gate change and allotment change, each
        # with the batch, route and workspace it is about; never the key.
        lines = json_lines(tmp_path / "worker0.log")
        workspace = stack.workspaces["alpha"]
        assert any(
            line.get("batch_id") == batch_id
            and line.get("workspace") == workspace
            and line.get("status") == "in_progress"
            and line.get("routes") == [route]
            for line in lines
        ), lines[-20:]
        assert any(
            line.get("route") == route and line.get("reason") == "Yielding to live traffic"
            for line in lines
        ), lines[-20:]
        assert any(
            line.get("route") == route
            and line.get("batch_id") == batch_id
            and line.get("workspace") == workspace
            and "allotment" in line["message"]
            for line in lines
        ), lines[-20:]
        for log in ("worker0.log", "api.log"):
            assert "sk-test-" not in (tmp_path / log).read_text()


async def test_a_hung_upstream_stalls_its_batch_and_a_cap_held_elsewhere_does_not(
    tmp_path: Path, dev_server: TemporalServer
) -> None:
    # Every upstream request hangs for a minute (the line timeout ends it after 20 s).
    sim = SimConfig(model_names=[], latency_ms=5, faults=[SimFault(delay_ms=60_000)])
    stack = Stack(
        tmp_path,
        dev_server.address,
        cap=1,
        sim=sim,
        limits={"line_timeout_seconds": 20.0},
        extra_env=FAST_EXPORT,
    )
    async with stack.running(), httpx.AsyncClient(timeout=30) as http:
        hung = await submit(stack, 3, prefix="hung")
        await poll_until(
            lambda: len(stack.sim.app.seen),
            lambda n: n >= 1,
            timeout=60,
            what="the first batch's line reaching the hanging upstream",
            interval=0.1,
        )
        waiting = await submit(stack, 3, prefix="wait")

        def stall(m: Samples, batch: str) -> float | None:
            found = [
                v
                for (name, labels), v in m.items()
                if name == "gateway_batch_stall_seconds" and ("batch", batch) in labels
            ]
            return found[0] if found else None

        m = await poll_until(
            lambda: scrape(http, worker_url(stack)),
            lambda m: (stall(m, hung) or 0) >= 3 and stall(m, waiting) is not None,
            timeout=15,
            what="the hung batch's stall clock past 3 s",
            interval=0.2,
        )
        # The second batch waits for the cap the first holds: a legitimate wait, no stall.
        assert stall(m, waiting) == 0, m
        assert len(stack.sim.app.seen) == 1  # nothing of the second batch went upstream
        labels = next(
            dict(labels)
            for (name, labels) in m
            if name == "gateway_batch_stall_seconds" and ("batch", hung) in labels
        )
        assert labels["workspace"] == stack.workspaces["alpha"]


def json_lines(path: Path) -> list[dict[str, Any]]:
    """The log's JSON lines (the Temporal core may print plain lines of its own)."""
    out = []
    for text in path.read_text().splitlines():
        if text.startswith("{"):
            out.append(json.loads(text))
    return out
