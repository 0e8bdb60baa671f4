"""The gateway's own gates on the real stack: "Yield to live traffic" holds batch lines back
while live requests are in flight (counted by the api, reported to the route's scheduler), a
route answering 429 backs off as a whole, honouring Retry-After, without failing a line, and
preemptive yield takes a running batch line's seat back for a live request, its cost counted in
the route's status.

Both read the simulator's record of what reached it (arrival times, the batch header)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import TemporalServer
from tests.e2e.stack import Stack, auth, submit, wait_terminal
from tools.sim import SimConfig, SimFault

ADMIN = "sk-test-admin"


def batch_arrivals(stack: Stack, after: float = 0.0) -> list[float]:
    return [s.at for s in stack.sim.app.seen if s.batch is not None and s.at > after]


async def poll(probe: Any, done: Any, *, within: float, what: str, every: float = 0.05) -> Any:
    """Bounded polling on observable state; fails naming what it waited for."""
    deadline = time.monotonic() + within
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if inspect.isawaitable(last):
            last = await last
        if done(last):
            return last
        await asyncio.sleep(every)
    raise AssertionError(f"timed out after {within} s waiting for {what}; last: {last!r}")


async def scheduling(stack: Stack, http: httpx.AsyncClient) -> dict[str, Any]:
    url = f"{stack.api_url}/api/v1/platform/deployments/{stack.route_id}/batch-scheduling"
    resp = await http.get(url, headers=auth(ADMIN))
    assert resp.status_code == 200, resp.text
    return resp.json()  # type: ignore[no-any-return]


async def worker_samples(stack: Stack, name: str, worker: int = 0) -> dict[str, float]:
    """Worker `worker`'s samples of metric `name`, by their `route` label ("" without)."""
    async with httpx.AsyncClient(timeout=10) as http:
        r = await http.get(f"http://127.0.0.1:{stack.worker_metrics_ports[worker]}/metrics")
    return {
        s.labels.get("route", ""): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
        if s.name == name
    }


async def held_back(stack: Stack, http: httpx.AsyncClient) -> float | None:
    """The worker's `gateway_batch_seats_held_back` for the stack's route (None: not yet set)."""
    return (await worker_samples(stack, "gateway_batch_seats_held_back")).get(stack.route_id)


async def put_settings(stack: Stack, http: httpx.AsyncClient, doc: dict[str, Any]) -> None:
    url = f"{stack.api_url}/api/v1/platform/deployments/{stack.route_id}/batch-scheduling"
    resp = await http.put(url, json=doc, headers=auth(ADMIN))
    assert resp.status_code == 200, resp.text


async def test_two_live_streams_at_yield_2_hold_batch_lines_back_until_released(
    tmp_path: Path, dev_server: TemporalServer
) -> None:
    sim = SimConfig(model_names=[], latency_ms=200, stream_token_delay_ms=1000)
    stack = Stack(tmp_path, dev_server.address, cap=2, sim=sim)
    async with stack.running(), httpx.AsyncClient(timeout=30) as http:
        await put_settings(
            stack,
            http,
            {"max_concurrent_lines": 2, "yield_to_live_traffic": {"pause_at_in_flight": 2}},
        )
        client = stack.client()
        batch_id = await submit(stack, 80)
        await poll(
            lambda: batch_arrivals(stack), lambda a: len(a) >= 4, within=60, what="lines flowing"
        )

        streams = []
        for _ in range(2):  # the simulator streams 16 tokens, a second apart: open for ~16 s
            stream = await client.chat.completions.create(
                model="demo",
                messages=[{"role": "user", "content": "a long answer"}],
                stream=True,
            )
            streams.append(stream)
            await stream.__anext__()  # its first chunk: it is in flight at the gateway
        opened = time.monotonic()
        doc = await poll(
            lambda: scheduling(stack, http),
            lambda d: d["status"]["state"] == "paused",
            within=10,
            what="the route paused for live traffic",
        )
        assert doc["status"]["reason"] == "Yielding to live traffic"
        assert doc["status"]["live_in_flight"] == 2
        batch = await client.batches.retrieve(batch_id)
        assert batch.model_extra is not None
        reasons = {r["reason"] for r in batch.model_extra["backfill"]["routes"]}
        assert reasons == {"Yielding to live traffic"}

        # Watch well past a line's upstream latency: nothing new may start. Lines already
        # running when the count crossed may still arrive within the reaction bound (1 s).
        await asyncio.sleep(3)
        assert batch_arrivals(stack, after=opened + 1.0) == []
        assert (await client.batches.retrieve(batch_id)).status == "in_progress"

        for stream in streams:
            await stream.close()
        released = time.monotonic()
        await poll(
            lambda: batch_arrivals(stack, after=released),
            lambda a: len(a) > 0,
            within=10,
            what="batch lines starting again",
        )
        first_after = batch_arrivals(stack, after=released)[0]
        assert first_after - released < 2.0, first_after - released
        done = await wait_terminal(client, batch_id, within=180)
        assert done.status == "completed" and done.request_counts.completed == 80
        metrics = (await http.get(f"{stack.api_url}/metrics", headers=auth("sk-test-auditor"))).text
        assert f'gateway_live_in_flight{{route="{stack.route_id}"}} 0.0' in metrics


async def test_a_route_answering_429_backs_off_as_a_whole_and_fails_no_line(
    tmp_path: Path, dev_server: TemporalServer
) -> None:
    sim = SimConfig(model_names=[], latency_ms=20)
    # Cap 2: two refusals per burst, so the back-off goes 2 s (Retry-After), then 8 s (doubling
    # with the batch's consecutive refusals): two bursts inside a 5 s spell, the third after it.
    stack = Stack(tmp_path, dev_server.address, cap=2, sim=sim)
    async with stack.running(), httpx.AsyncClient(timeout=30) as http:
        client = stack.client()
        stack.sim.app.faults.add([SimFault(status=429, retry_after=2)])
        batch_id = await submit(stack, 30)
        await poll(
            lambda: scheduling(stack, http),
            lambda d: d["status"]["reason"] == "Rate limited · backing off",
            within=30,
            what="the route backing off",
        )
        # The upstream keeps answering 429 for 5 s from the first line it refused, then serves.
        limited_from = batch_arrivals(stack)[0]
        await asyncio.sleep(max(0.0, limited_from + 5 - time.monotonic()))
        stack.sim.app.faults.clear()
        limited_until = time.monotonic()

        done = await wait_terminal(client, batch_id, within=180)
        assert done.status == "completed"
        assert (done.request_counts.completed, done.request_counts.failed) == (30, 0)

        # While backing off nothing was sent: arrivals during the 429 spell come in bursts
        # (the lines that were running together), each at least Retry-After after the last.
        limited = [t for t in batch_arrivals(stack) if limited_from <= t <= limited_until]
        assert len(limited) >= 2
        bursts = [limited[0]]
        for t in limited[1:]:
            if t - bursts[-1] > 0.5:
                bursts.append(t)
        gaps = [b - a for a, b in zip(bursts, bursts[1:], strict=False)]
        assert gaps and min(gaps) >= 2.0 - 0.2, (bursts, gaps)
        per_burst = len(limited) / len(bursts)
        assert per_burst <= 2, per_burst  # never more than the cap at once


async def test_the_priority_hint_reaches_batch_lines_only(
    tmp_path: Path, dev_server: TemporalServer
) -> None:
    sim = SimConfig(model_names=[], latency_ms=20, scheduling_policy="priority")
    stack = Stack(tmp_path, dev_server.address, cap=2, sim=sim)
    async with stack.running(), httpx.AsyncClient(timeout=30) as http:
        await put_settings(stack, http, {"max_concurrent_lines": 2, "priority_hint": 10})
        client = stack.client()
        batch_id = await submit(stack, 6)
        for _ in range(2):
            await client.chat.completions.create(
                model="demo", messages=[{"role": "user", "content": "live"}]
            )
        done = await wait_terminal(client, batch_id, within=120)
        assert done.status == "completed" and done.request_counts.completed == 6
        seen = list(stack.sim.app.seen)
        batch = [s for s in seen if s.batch is not None]
        live = [s for s in seen if s.batch is None]
        assert len(batch) == 6 and len(live) == 2
        assert {s.priority for s in batch} == {10}
        assert not any(s.has_priority for s in live)


async def test_a_preempted_line_is_counted_in_the_batch_and_the_route_status(
    tmp_path: Path, dev_server: TemporalServer
) -> None:
    """Seat-aware admission with preemption over the direct api → worker channel: a live
    request needs a seat the route's two batch lines hold, the youngest is ended and requeued,
    and the batch's `backfill.routes[]` and the route's status count it."""
    sim = SimConfig(model_names=[], latency_ms=1000, stream_token_delay_ms=200)
    stack = Stack(
        tmp_path, dev_server.address, cap=2, sim=sim, preempt_token="e2e-preempt-" + "p" * 32
    )
    async with stack.running(), httpx.AsyncClient(timeout=30) as http:
        settings: dict[str, Any] = {
            "max_concurrent_lines": 2,
            "seat_aware": {"seats": 3, "keep_free": 1},
            "preempt": {"max_preemptions": 100},
        }
        await put_settings(stack, http, settings)
        client = stack.client()
        # The worker has read the route's preemption on and hears the api's live counts, so the
        # first live arrival beside two running lines ends one (else it could come before, and
        # the allotment alone would keep the seat: no line to end).
        await poll(
            lambda: worker_samples(stack, "gateway_preempt_on"),
            lambda s: s.get(stack.route_id) == 1,
            within=30,
            what="the worker reading the route's preemption on",
        )
        await poll(
            lambda: worker_samples(stack, "gateway_preempt_reporting_processes"),
            lambda s: s.get(stack.route_id, 0) >= 1,
            within=30,
            what="the api's live counts reaching the worker",
        )
        batch_id = await submit(stack, 40)
        await poll(
            lambda: batch_arrivals(stack), lambda a: len(a) >= 2, within=30, what="lines flowing"
        )

        async def live_traffic() -> None:
            """One live stream in flight at a time (each ~4 s), until cancelled."""
            while True:
                stream = await client.chat.completions.create(
                    model="demo", messages=[{"role": "user", "content": "live"}], stream=True
                )
                async for _ in stream:
                    pass

        live = asyncio.ensure_future(live_traffic())
        try:
            await poll(
                lambda: scheduling(stack, http),
                lambda d: d["status"]["preempted_lines"] > 0,
                within=15,
                what="a batch line preempted for the live stream",
                every=0.2,
            )
            # A live TTFT target no stream can meet (each takes ~1 s to its first token): the
            # worker holds back every shared seat, from the TTFT the api measured and sent.
            settings["preempt"] = {"max_preemptions": 100, "live_ttft_target_ms": 1}
            await put_settings(stack, http, settings)
            await poll(
                lambda: held_back(stack, http),
                lambda n: n == 2,
                within=30,
                what="the worker holding both shared seats back for the live TTFT target",
                every=0.2,
            )
        finally:
            live.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await live
        batch = await client.batches.retrieve(batch_id)
        assert batch.model_extra is not None
        [entry] = batch.model_extra["backfill"]["routes"]
        assert entry["preempted_lines"] > 0
        # The route's status is the sum over its batches (this one only), read after it.
        status = (await scheduling(stack, http))["status"]
        assert status["preempted_lines"] >= entry["preempted_lines"]
        assert status["wasted_tokens"] >= entry["wasted_tokens"]
        await client.batches.cancel(batch_id)
