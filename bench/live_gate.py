""" "Yield to live traffic", measured on the real stack (dev server, worker, two api processes,
the simulator): how fast batch lines stop and start again when live traffic crosses the
threshold, and how much the route scheduler's history grows under live traffic.

    .venv/bin/python -m bench.live_gate --crossings 20

Reaction (threshold crossed -> no new line start; count back below -> lines start again) is
read at the upstream: the simulator records when each batch line arrives. "Stop" is the time
from the crossing (the second stream's first byte reached the client) to the last batch line
that still arrived after it; "start" from the release (both streams closed) to the first batch
line after it.

History growth: the scheduler's history length before and after a spell of live traffic:
- quiet side: live requests at ~50/s whose in-flight sum stays below the threshold;
- hardest case: ~50 live requests/s through both api processes with the threshold set near
  the typical in-flight sum, so it is crossed all the time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from backfill.platform.ids import scheduler_workflow_id
from tests.e2e.stack import Stack, auth, submit
from tools.dev.devserver import DevServer, connect_client
from tools.dev.procs import Child, backfill_argv, free_port
from tools.sim import SimConfig, SimFault

ADMIN = "sk-test-admin"
DEBUG = bool(os.environ.get("BENCH_DEBUG"))


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def put(stack: Stack, http: httpx.AsyncClient, doc: dict[str, Any]) -> None:
    url = f"{stack.api_url}/api/v1/platform/deployments/{stack.route_id}/batch-scheduling"
    resp = await http.put(url, json=doc, headers=auth(ADMIN))
    resp.raise_for_status()


def arrivals(stack: Stack, after: float) -> list[float]:
    return [s.at for s in stack.sim.app.seen if s.batch is not None and s.at > after]


def live_arrivals(stack: Stack, after: float) -> list[float]:
    return [s.at for s in stack.sim.app.seen if s.batch is None and s.at > after]


async def crossing(
    stack: Stack, http: httpx.AsyncClient, hold: float, gap: float
) -> tuple[float, float]:
    """Two live requests held open `hold` seconds at the upstream (a delay fault that matches
    only live requests: they carry X-Request-ID, batch lines do not)."""
    t0 = time.monotonic()
    body = {"model": "demo", "messages": [{"role": "user", "content": "x"}]}
    tasks = [
        asyncio.create_task(
            http.post(f"{stack.api_url}/v1/chat/completions", json=body, headers=auth())
        )
        for _ in range(2)
    ]
    while len(live_arrivals(stack, t0)) < 2:
        await asyncio.sleep(0.002)
    crossed = max(live_arrivals(stack, t0)[:2])  # both counted at the gateway by now
    for task in tasks:
        (await task).raise_for_status()
    released = time.monotonic()
    late = [t for t in arrivals(stack, crossed) if t < released]
    stop = (max(late) - crossed) if late else 0.0
    if DEBUG:
        print("late", [round(t - crossed, 3) for t in late], file=sys.stderr)
    deadline = released + 10
    while not arrivals(stack, released) and time.monotonic() < deadline:
        await asyncio.sleep(0.002)
    after = arrivals(stack, released)
    start = (min(after) - released) if after else float("inf")
    await asyncio.sleep(gap)  # isolated crossings: lines flow again before the next one
    return stop, start


async def history_length(stack: Stack, temporal: Any) -> int:
    handle = temporal.get_workflow_handle(scheduler_workflow_id(stack.route_id))
    desc = await handle.describe()
    return int(desc.raw_description.workflow_execution_info.history_length)


async def live_load(urls: list[str], rate: float, seconds: float, latency_note: str) -> int:
    """~`rate` non-streaming live requests per second for `seconds`, spread over `urls`."""
    sent = 0
    async with httpx.AsyncClient(timeout=30) as http:
        tasks = []
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            url = urls[sent % len(urls)]
            body = {"model": "demo", "messages": [{"role": "user", "content": latency_note}]}
            tasks.append(
                asyncio.create_task(
                    http.post(f"{url}/v1/chat/completions", json=body, headers=auth())
                )
            )
            sent += 1
            await asyncio.sleep(1 / rate)
        await asyncio.gather(*tasks, return_exceptions=True)
    return sent


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        server = DevServer(tmp / "temporal", port=free_port(), ui_port=None)
        server.start()
        try:
            await server.wait_ready_async(timeout=60)
            sim = SimConfig(model_names=[], latency_ms=args.latency_ms)
            # Reconcile ticks would add history of their own: out of the way here.
            stack = Stack(tmp, server.address, cap=args.cap, sim=sim, reconcile_seconds=3600)
            async with stack.running(), httpx.AsyncClient(timeout=30) as http:
                api2 = Child("api2")
                port2 = free_port()
                env2 = {**stack.env(), "BACKFILL_API_PORT": str(port2)}
                api2.start(backfill_argv("api"), env2, tmp / "api2.log")
                try:
                    return await measure(args, stack, http, f"http://127.0.0.1:{port2}", server)
                finally:
                    await asyncio.to_thread(api2.stop)
        finally:
            await asyncio.to_thread(server.stop)


async def measure(
    args: argparse.Namespace, stack: Stack, http: httpx.AsyncClient, api2: str, server: DevServer
) -> dict[str, Any]:
    temporal = await connect_client(server.address, server.namespace)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if (await http.get(f"{api2}/healthz")).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.2)
    await put(
        stack,
        http,
        {"max_concurrent_lines": args.cap, "yield_to_live_traffic": {"pause_at_in_flight": 2}},
    )
    await submit(stack, args.lines)
    while len(arrivals(stack, 0)) < args.cap * 2:
        await asyncio.sleep(0.05)

    stops, starts = [], []
    stack.sim.app.faults.add(
        [SimFault(delay_ms=args.hold * 1000, match_custom_header="x-request-id")]
    )
    for _ in range(args.crossings):
        stop, start = await crossing(stack, http, hold=args.hold, gap=args.gap)
        stops.append(stop)
        starts.append(start)
    stack.sim.app.faults.clear()

    # History growth, quiet side: threshold far above the in-flight sum.
    await put(
        stack,
        http,
        {"max_concurrent_lines": args.cap, "yield_to_live_traffic": {"pause_at_in_flight": 1000}},
    )
    await live_load([stack.api_url, api2], args.rate, 3, "warm-up")  # both processes register
    await asyncio.sleep(1)
    before = await history_length(stack, temporal)
    sent = await live_load([stack.api_url, api2], args.rate, args.seconds, "quiet")
    quiet_events = await history_length(stack, temporal) - before

    # Hardest case: threshold at the typical in-flight sum (rate x latency).
    typical = max(1, round(args.rate * args.latency_ms / 1000))
    await put(
        stack,
        http,
        {
            "max_concurrent_lines": args.cap,
            "yield_to_live_traffic": {"pause_at_in_flight": typical},
        },
    )
    await asyncio.sleep(1)
    before = await history_length(stack, temporal)
    t0 = time.monotonic()
    sent_hard = await live_load([stack.api_url, api2], args.rate, args.seconds, "hard")
    elapsed = time.monotonic() - t0
    hard_events = await history_length(stack, temporal) - before
    return {
        "crossings": args.crossings,
        "stop_s": {"p50": pct(stops, 0.5), "p99": pct(stops, 0.99), "max": max(stops)},
        "start_s": {"p50": pct(starts, 0.5), "p99": pct(starts, 0.99), "max": max(starts)},
        "stop_mean_s": statistics.mean(stops),
        "quiet": {"live_requests": sent, "seconds": args.seconds, "scheduler_events": quiet_events},
        "hardest": {
            "live_requests": sent_hard,
            "threshold": typical,
            "seconds": round(elapsed, 1),
            "scheduler_events": hard_events,
            "events_per_second": round(hard_events / elapsed, 2),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--crossings", type=int, default=20)
    parser.add_argument("--cap", type=int, default=4)
    parser.add_argument("--lines", type=int, default=20_000)
    parser.add_argument("--latency-ms", type=float, default=100.0)
    parser.add_argument("--hold", type=float, default=2.0)
    parser.add_argument("--gap", type=float, default=4.0, help="seconds between crossings")
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args)), indent=2))


if __name__ == "__main__":
    main()
