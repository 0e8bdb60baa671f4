"""Issue 25, item 5: does one workspace's flood of slow live streams leave another's live
requests unaffected? Measured on real processes: the simulator as upstream and two api
processes on it (no Temporal needed: the live proxy does not use it).

    .venv/bin/python -m bench.live_isolation --flood 1100 --requests 40

- api "capped": the shipped default `max_live_in_flight` (256) for every workspace;
- api "uncapped": the same, but alpha may have `--flood` streams in flight.

Phases, in one run: (1) quiet: workspace beta sends `--requests` non-streamed chat requests,
`--concurrency` at a time, to the capped api; (2) flood on the capped api: alpha keeps `--flood`
slow streams open (each ~`--token-delay-ms` per event, re-opened as soon as one ends or is
refused) while beta sends the same requests; (3) the same flood and requests on the uncapped
api. Reported per phase: beta's p50/p99/max latency and errors by status, and alpha's streams
in flight (those answered 200) and refusals. The api's upstream pool holds 1,024 connections
(`api.app.UPSTREAM_LIMITS`), so a flood above that starves everyone without the cap.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from tests.e2e.stack import Stack, auth
from tools.dev.procs import Child, backfill_argv, free_port
from tools.sim import SimConfig

REFUSED_BACKOFF = 5.0
"""Seconds a flood stream refused with 429 waits before it tries again (a client that honours
429; one that retries at once costs the api CPU for every refusal, which no cap prevents)."""
MSG = [{"role": "user", "content": "one two three four five six seven eight"}]


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Flood:
    """`n` slow streams of alpha kept open against `url` until `stop()`."""

    def __init__(self, url: str, n: int) -> None:
        self.url, self.n = url, n
        self.open = 0
        self.statuses: collections.Counter[int | str] = collections.Counter()
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._http = httpx.AsyncClient(
            timeout=60, limits=httpx.Limits(max_connections=None, max_keepalive_connections=0)
        )

    async def start(self, settle: float) -> None:
        self._tasks = [asyncio.create_task(self._slot()) for _ in range(self.n)]
        await asyncio.sleep(settle)  # let the streams open before measuring

    async def _slot(self) -> None:
        body = {"model": "demo", "messages": MSG, "stream": True}
        while not self._stop.is_set():
            try:
                async with self._http.stream(
                    "POST", f"{self.url}/v1/chat/completions", json=body, headers=auth()
                ) as resp:
                    self.statuses[resp.status_code] += 1
                    if resp.status_code != 200:
                        await resp.aread()
                        await asyncio.sleep(REFUSED_BACKOFF)
                        continue
                    self.open += 1
                    try:
                        async for _ in resp.aiter_raw():
                            if self._stop.is_set():
                                break
                    finally:
                        self.open -= 1
            except httpx.HTTPError as e:
                self.statuses[type(e).__name__] += 1
                await asyncio.sleep(0.5)

    async def stop(self) -> None:
        self._stop.set()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._http.aclose()


async def measure(url: str, n: int, concurrency: int) -> dict[str, Any]:
    """Beta's `n` non-streamed requests, `concurrency` at a time: latencies and statuses."""
    latencies: list[float] = []
    statuses: collections.Counter[int | str] = collections.Counter()
    body = {"model": "demo", "messages": MSG}
    queue = iter(range(n))
    async with httpx.AsyncClient(timeout=60, headers=auth("sk-test-beta")) as http:

        async def one() -> None:
            for _ in queue:
                start = time.monotonic()
                try:
                    resp = await http.post(f"{url}/v1/chat/completions", json=body)
                    statuses[resp.status_code] += 1
                except httpx.HTTPError as e:
                    statuses[type(e).__name__] += 1
                latencies.append(time.monotonic() - start)

        await asyncio.gather(*(one() for _ in range(concurrency)))
    return {
        "p50_ms": round(pct(latencies, 0.5) * 1000, 1),
        "p99_ms": round(pct(latencies, 0.99) * 1000, 1),
        "max_ms": round(max(latencies) * 1000, 1),
        "statuses": dict(statuses),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    # SIGTERM/SIGINT cancel the run, so the api processes it started are stopped (finally).
    task = asyncio.current_task()
    assert task is not None
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, task.cancel)
    tmp = Path(tempfile.mkdtemp(prefix="bench-live-isolation-"))
    sim = SimConfig(
        model_names=[],
        latency_ms=5,
        max_num_seqs=100_000,
        stream_token_delay_ms=args.token_delay_ms,
    )
    # Temporal is not used by the live proxy: point the api at a port nobody listens on.
    nowhere = f"127.0.0.1:{free_port()}"
    capped = Stack(tmp / "capped", nowhere, sim=sim)
    uncapped = Stack(
        tmp / "uncapped", nowhere, workspace_limits={"alpha": {"max_live_in_flight": 1_000_000}}
    )
    for s in (capped, uncapped):
        s.tmp.mkdir(parents=True)
    # One simulator for both apis: the uncapped stack's routes point at the capped one's sim.
    uncapped.sim = capped.sim
    uncapped.route_sims = {r: capped.sim for r in uncapped.routes}
    uncapped.workspaces = capped.workspaces  # the same workspace names on both apis
    await capped.sim.start()
    children: list[Child] = []
    try:
        for s in (capped, uncapped):
            s.write_config()
            s.api.start(backfill_argv("api"), s.env(), s.tmp / "api.log")
            children.append(s.api)
            await s.wait_healthy(temporal=False)
        out: dict[str, Any] = {"flood": args.flood, "token_delay_ms": args.token_delay_ms}
        out["quiet"] = await measure(capped.api_url, args.requests, args.concurrency)
        print("quiet", json.dumps(out["quiet"]), file=sys.stderr, flush=True)  # noqa: T201
        for name, s in (("flood_capped", capped), ("flood_uncapped", uncapped)):
            flood = Flood(s.api_url, args.flood)
            await flood.start(args.settle)
            try:
                result = await measure(s.api_url, args.requests, args.concurrency)
                result["alpha_open_streams"] = flood.open
            finally:
                await flood.stop()
            result["alpha_statuses"] = dict(flood.statuses)
            out[name] = result
            print(name, json.dumps(result), file=sys.stderr, flush=True)  # noqa: T201
            await asyncio.sleep(2)  # the simulator's streams wind down
        return out
    finally:
        for child in children:
            await asyncio.to_thread(child.stop)
        await capped.sim.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--flood", type=int, default=1100, help="alpha's streams kept open")
    p.add_argument("--requests", type=int, default=40, help="beta's requests per phase")
    p.add_argument("--concurrency", type=int, default=4, help="beta's requests at once")
    p.add_argument("--token-delay-ms", type=float, default=1000.0)
    p.add_argument("--settle", type=float, default=8.0, help="seconds for the flood to open")
    print(json.dumps(asyncio.run(run(p.parse_args())), indent=2))  # noqa: T201


if __name__ == "__main__":
    main()
