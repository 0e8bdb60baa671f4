"""How fast the gateway takes a seat back: a live request arrives at the api → a batch line's
upstream request is closed at the simulator (preemptive yield, docs/decisions/0023).

    PYTHONPATH=. .venv/bin/python -m bench.seat_back --samples 30

The real stack (Temporal dev server, one worker, one api, preemption's direct channel on) with
the simulator in GPU mode as the route's upstream (8 seats). The route runs seat-aware admission
(8 seats, 2 kept free) with preemption, so 6 long batch lines fill the shared seats. Each sample
sends one streamed live request through the api's proxy and times, on the simulator's clock (the
same process and monotonic clock as the client), the first batch abort after it was sent; then
waits for the live request to end and the batch lines to fill the seats again. Prints p50/p99.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import httpx

from bench.common import dev_server, log
from tools.dev.procs import backfill_argv, free_port
from tools.sim import GpuConfig, SimConfig, SimServer
from tools.sim.gpu import percentile

SEATS, KEEP_FREE = 8, 2
SETTINGS = {
    "max_concurrent_lines": SEATS - KEEP_FREE,
    "seat_aware": {"seats": SEATS, "keep_free": KEEP_FREE},
    "preempt": {"max_preemptions": 100},
}
CHAT = "/v1/chat/completions"
TOKEN = "bench-preempt-token-" + "b" * 32


def sim_config() -> SimConfig:
    gpu = GpuConfig(step_base_ms=20, step_per_seq_ms=1, prefill_per_token_ms=0.01)
    return SimConfig(max_num_seqs=SEATS, gpu=gpu, scheduling_policy="priority")


async def until(pred, within: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + within
    while not pred():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


async def run(samples: int) -> dict[str, object]:
    from tests.e2e.stack import Stack, auth

    with tempfile.TemporaryDirectory(prefix="bench-seat-back-") as tmp:
        async with dev_server(Path(tmp)) as server:
            stack = Stack(Path(tmp), server.address, cap=SEATS, sim=sim_config())
            stack.sim = SimServer(sim_config(), port=free_port())
            stack.route_sims = {route: stack.sim for route in stack.routes}
            stack.extra_env["BACKFILL_PREEMPT_TOKEN"] = TOKEN
            await stack.sim.start()
            stack.write_config()
            stack.start_worker()
            port = stack.worker_metrics_ports[0]
            stack.extra_env["BACKFILL_PREEMPT_WORKER_URLS"] = f"http://127.0.0.1:{port}"
            stack.api.start(backfill_argv("api"), stack.env(), stack.tmp / "api.log")
            try:
                await stack.wait_healthy()
                result = await measure(stack, samples, auth)
                log(f"result: {json.dumps(result)}")  # before the stack drains its batch
                return result
            finally:
                await stack.stop()


async def measure(stack, samples: int, auth) -> dict[str, object]:  # type: ignore[no-untyped-def]
    engine = stack.sim.app.engine
    url = f"{stack.api_url}/api/v1/platform/deployments/{stack.route_id}/batch-scheduling"
    async with httpx.AsyncClient(timeout=60) as http:
        r = await http.put(url, json=SETTINGS, headers=auth("sk-test-admin"))
        assert r.status_code == 200, r.text
    body = {"model": "demo", "messages": [{"role": "user", "content": "w " * 50}]}
    line = {**body, "max_tokens": 1500}
    lines = [
        json.dumps({"custom_id": f"l{i}", "method": "POST", "url": CHAT, "body": line})
        for i in range(200)
    ]
    client = stack.client()
    f = await client.files.create(
        file=("b.jsonl", ("\n".join(lines) + "\n").encode()), purpose="batch"
    )
    batch = await client.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h")
    full = SEATS - KEEP_FREE
    batch_running = lambda: stack.sim.app.stats.batch.concurrent  # noqa: E731
    await until(lambda: batch_running() >= full, 120, "batch lines filling the shared seats")
    await asyncio.sleep(7)  # the api reads the route's preemption policy every 5 s
    latencies: list[float] = []
    missed = 0
    for i in range(samples):
        await until(lambda: batch_running() >= full, 60, "the seats filled again")
        await asyncio.sleep(0.3)
        aborted = len(engine.log.batch.aborted_at)
        sent = time.monotonic()
        stream = await client.chat.completions.create(
            model="demo", messages=body["messages"], max_tokens=8, stream=True
        )
        async for _ in stream:
            pass
        try:
            await until(lambda n=aborted: len(engine.log.batch.aborted_at) > n, 5, "an abort")
        except RuntimeError:
            missed += 1
            continue
        latencies.append((engine.log.batch.aborted_at[aborted] - sent) * 1000)
        log(f"sample {i}: {latencies[-1]:.1f} ms")
    await client.batches.cancel(batch.id)
    return {
        "samples": len(latencies),
        "missed": missed,
        "p50_ms": percentile(latencies, 50),
        "p99_ms": percentile(latencies, 99),
        "max_ms": max(latencies) if latencies else None,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=30)
    args = p.parse_args(argv)
    result = asyncio.run(run(args.samples))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
