"""Spare capacity on the real engine: a vLLM (the CPU build, the tiny random-weight Llama of
`make test-vllm`, or any `--upstream`) with live traffic and a batch load beside it. Issue 37.

    .venv/bin/python -m bench.real_engine --out bench-real-engine.json
    .venv/bin/python -m bench.real_engine --upstream http://127.0.0.1:8200 --rows live,naive

The simulator benches (`bench.spare_capacity`) count tokens per class inside the simulator; a
real engine only reports totals, so here live tokens are counted by the client (each live stream
asks for its usage) and batch tokens are vLLM's `vllm:generation_tokens_total` over the window
minus the live ones. One open-loop Poisson live workload (seeded, the same in every row): short
streamed chats, `--live-rate` a second, each `--live-tokens` long. Rows:

- `live`: live traffic alone (the reference of the ratios);
- `naive`: plus a client keeping `--seats` batch requests in flight straight to vLLM;
- `backfill`: plus a backfill batch through the gateway (Temporal dev server, worker, api) with
  deploy/examples/batch-scheduling/bursty-vllm.json's settings (seat-aware admission, preemptive
  yield, priority hint), its seats set to `--seats`;
- `engine-priority`: the naive client's requests with `priority` 10 on a vLLM started with
  `--scheduling-policy priority`, live at 0: what the engine's own priority gives, alone;
- `backfill+priority`: the backfill row on that server (the hint now counts).

Spare = the saturation capacity (2 × seats requests in flight, measured first on each server)
minus the live row's live tokens/s; batch share = batch tokens/s ÷ spare. The CPU build is slow and
shares the cores with everything else: read the ratios of one run, side by side, not the absolute
numbers. Without `--upstream`, vLLM is started from `--venv` (built by `make test-vllm`), one server
per policy in turn. With `--upstream`, every row runs on that one server, whatever its policy;
the gateway's model id is `demo`, so serve the model under that name (`--model` changes what the
client rows ask for, not the gateway's).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.common import clear_settings_env, log

ROOT = Path(__file__).resolve().parents[1]
CHAT = "/v1/chat/completions"
SETTINGS = ROOT / "deploy/examples/batch-scheduling/bursty-vllm.json"
BATCH_PRIORITY = 10


@dataclass
class Config:
    seats: int = 8
    live_rate: float = 2.0
    live_tokens: int = 32
    batch_tokens: int = 128
    window_s: float = 60.0
    capacity_s: float = 30.0
    seed: int = 1
    model: str = "demo"
    """The served model name (`--served-model-name`); the started vLLM serves `tiny` and `demo`."""


@dataclass
class Row:
    name: str
    policy: str
    live_sent: int = 0
    live_errors: int = 0
    ttft_ms: list[float] = field(default_factory=list)
    live_tokens_per_s: float = 0.0
    batch_tokens_per_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def ttft(self, q: float) -> float | None:
        xs = sorted(self.ttft_ms)
        return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None


def body(cfg: Config, tokens: int, words: int, **extra: Any) -> dict[str, Any]:
    prompt = " ".join(f"w{i}" for i in range(words))
    return {
        "model": cfg.model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": tokens,
        "ignore_eos": True,  # vLLM: exactly max_tokens, whatever the random model samples
        **extra,
    }


async def generated(http: httpx.AsyncClient, url: str) -> float:
    text = (await http.get(f"{url}/metrics")).text
    for family in text_string_to_metric_families(text):
        if family.name == "vllm:generation_tokens":
            return sum(s.value for s in family.samples if s.name.endswith("_total"))
    raise RuntimeError(f"{url}/metrics has no vllm:generation_tokens_total")


async def live_stream(http: httpx.AsyncClient, url: str, cfg: Config, row: Row) -> int:
    """One live request; its TTFT into `row`, its completion tokens returned."""
    start = time.monotonic()
    req = {
        **body(cfg, cfg.live_tokens, 20),
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    tokens = 0
    try:
        async with http.stream("POST", f"{url}{CHAT}", json=req) as resp:
            if resp.status_code != 200:
                row.live_errors += 1
                return 0
            first = True
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if first and event.get("choices"):
                    row.ttft_ms.append(1000 * (time.monotonic() - start))
                    first = False
                if event.get("usage"):
                    tokens = event["usage"]["completion_tokens"]
    except httpx.HTTPError:
        row.live_errors += 1
    return tokens


async def replay(url: str, headers: dict[str, str], cfg: Config, row: Row) -> int:
    """The Poisson live workload for the window; live tokens generated."""
    rnd = random.Random(cfg.seed)
    at, arrivals = 0.0, []
    while (at := at + rnd.expovariate(cfg.live_rate)) < cfg.window_s:
        arrivals.append(at)
    row.live_sent = len(arrivals)
    t0 = time.monotonic()
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
    async with httpx.AsyncClient(timeout=600, headers=headers, limits=limits) as http:

        async def one(a: float) -> int:
            await asyncio.sleep(max(0.0, t0 + a - time.monotonic()))
            return await live_stream(http, url, cfg, row)

        return sum(await asyncio.gather(*(one(a) for a in arrivals)))


class Naive:
    """`n` workers, each sending one batch request after another straight to vLLM."""

    def __init__(self, url: str, cfg: Config, n: int, priority: int | None = None) -> None:
        extra = {} if priority is None else {"priority": priority}
        self.url, self.req = url, body(cfg, cfg.batch_tokens, 100, **extra)
        self.n, self.tasks, self.done = n, list[asyncio.Task[None]](), 0

    async def _worker(self) -> None:
        async with httpx.AsyncClient(timeout=600) as http:
            while True:
                r = await http.post(f"{self.url}{CHAT}", json=self.req)
                self.done += r.status_code == 200

    async def start(self) -> None:
        self.tasks = [asyncio.create_task(self._worker()) for _ in range(self.n)]

    async def stop(self) -> dict[str, Any]:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        return {"batch_requests_completed": self.done}


class Backfill:
    """A batch through the gateway with the shipped bursty-vllm settings."""

    def __init__(self, stack: Any, cfg: Config) -> None:
        self.stack, self.cfg, self.batch_id = stack, cfg, ""

    async def start(self) -> None:
        from api.preemption.push import POLICY_TTL
        from tests.e2e.stack import auth

        settings = json.loads(SETTINGS.read_text())
        settings["seat_aware"]["seats"] = self.cfg.seats
        url = f"{self.stack.api_url}/api/v1/platform/deployments/{self.stack.route_id}"
        async with httpx.AsyncClient(timeout=30) as http:
            r = await http.put(
                f"{url}/batch-scheduling", json=settings, headers=auth("sk-test-admin")
            )
            r.raise_for_status()
        put_at = time.monotonic()
        line = {"method": "POST", "url": CHAT, "body": body(self.cfg, self.cfg.batch_tokens, 100)}
        data = "".join(json.dumps({"custom_id": f"l{i}", **line}) + "\n" for i in range(2000))
        client = self.stack.client()
        f = await client.files.create(file=("b.jsonl", data.encode()), purpose="batch")
        batch = await client.batches.create(
            input_file_id=f.id, endpoint=CHAT, completion_window="24h"
        )
        self.batch_id = batch.id
        await asyncio.sleep(max(0.0, put_at + POLICY_TTL + 1.0 - time.monotonic()))

    async def stop(self) -> dict[str, Any]:
        client = self.stack.client()
        await client.batches.cancel(self.batch_id)
        for _ in range(600):
            batch = await client.batches.retrieve(self.batch_id)
            if batch.status == "cancelled":
                break
            await asyncio.sleep(1)
        counts = batch.request_counts
        return {"batch_lines_completed": counts.completed if counts else None}


async def run_row(name: str, policy: str, url: str, stack: Any, cfg: Config) -> Row:
    row = Row(name, policy)
    load: Any = None
    if name.startswith("naive") or name == "engine-priority":
        load = Naive(url, cfg, cfg.seats, BATCH_PRIORITY if name == "engine-priority" else None)
    elif name.startswith("backfill"):
        load = Backfill(stack, cfg)
    if load is not None:
        await load.start()
        await asyncio.sleep(5)  # the batch load settles before the window
    live_url, headers = url, {}
    if stack is not None:
        from tests.e2e.stack import auth

        live_url, headers = stack.api_url, auth()  # every row's live traffic pays the proxy hop
    async with httpx.AsyncClient(timeout=30) as http:
        g0, t0 = await generated(http, url), time.monotonic()
        live_tokens = await replay(live_url, headers, cfg, row)
        g1, t1 = await generated(http, url), time.monotonic()
    if load is not None:
        row.extra = await load.stop()
    row.live_tokens_per_s = live_tokens / (t1 - t0)
    row.batch_tokens_per_s = max(0.0, (g1 - g0 - live_tokens) / (t1 - t0))
    log(f"{name} ({policy}): {json.dumps(asdict(row) | {'ttft_ms': None})}")
    if row.live_errors == row.live_sent:
        raise RuntimeError(f"every live request of row {name} failed (is --model served?)")
    return row


async def capacity(url: str, cfg: Config) -> float:
    load = Naive(url, cfg, 2 * cfg.seats)
    await load.start()
    await asyncio.sleep(10)
    async with httpx.AsyncClient(timeout=30) as http:
        g0, t0 = await generated(http, url), time.monotonic()
        await asyncio.sleep(cfg.capacity_s)
        g1, t1 = await generated(http, url), time.monotonic()
    await load.stop()
    return (g1 - g0) / (t1 - t0)


@contextlib.asynccontextmanager
async def upstream(args: argparse.Namespace, policy: str, cfg: Config) -> AsyncIterator[str]:
    if args.upstream:
        yield args.upstream.rstrip("/")
        return
    from tests.vllm.upstreams import VllmProcess, vllm_model

    venv = ROOT / args.venv if not Path(args.venv).is_absolute() else Path(args.venv)  # noqa: ASYNC240
    log_path = Path(tempfile.mkdtemp(prefix="bench-vllm-")) / f"vllm-{policy}.log"
    server = VllmProcess(venv, vllm_model(venv), log_path, policy, cfg.seats)
    server.start()
    try:
        took = await server.wait_ready()
        log(f"vLLM ({policy}) up in {took:.0f} s on {server.url}")
        yield server.url
    finally:
        server.stop()


@contextlib.asynccontextmanager
async def gateway(url: str, cfg: Config) -> AsyncIterator[Any]:
    from bench.common import dev_server
    from tests.vllm.upstreams import VllmStack

    with tempfile.TemporaryDirectory(prefix="bench-real-") as tmp:
        async with dev_server(Path(tmp)) as server:
            stack = VllmStack(
                Path(tmp),
                server.address,
                vllm_url=url,
                cap=cfg.seats,
                preempt_token="bench-" + "b" * 32,
            )
            stack.extra_env["GATEWAY_LOCAL_UPSTREAMS"] = f"{url}/v1"
            async with stack.running():
                yield stack


async def run(args: argparse.Namespace) -> dict[str, Any]:
    cfg = Config(seats=args.seats, live_rate=args.live_rate, window_s=args.window, model=args.model)
    rows = args.rows.split(",")
    out: dict[str, Any] = {"config": asdict(cfg), "rows": [], "capacity": {}}
    by_policy = {
        "fcfs": [r for r in rows if r in ("live", "naive", "backfill")],
        "priority": [r for r in rows if r in ("engine-priority", "backfill+priority")],
    }
    for policy, names in by_policy.items():
        if not names:
            continue
        async with upstream(args, policy, cfg) as url:
            out["capacity"][policy] = cap = await capacity(url, cfg)
            log(f"capacity ({policy}): {cap:.0f} tokens/s")
            need_gateway = any(n.startswith("backfill") for n in names) or "live" in names
            async with gateway(url, cfg) if need_gateway else contextlib.nullcontext() as stack:
                for name in names:
                    out["rows"].append(asdict(await run_row(name, policy, url, stack, cfg)))
    return out


def table(result: dict[str, Any]) -> str:
    rows = result["rows"]
    live = next((r for r in rows if r["name"] == "live"), None)
    spare = {
        p: cap - (live["live_tokens_per_s"] if live else 0.0)
        for p, cap in result["capacity"].items()
    }
    p99_ref = Row(**live).ttft(0.99) if live else None
    lines = [
        "| row | policy | batch tok/s | batch share | live TTFT p50 | p99 | p99 ÷ live | errors |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for d in rows:
        r = Row(**d)
        share = r.batch_tokens_per_s / spare[r.policy] if spare.get(r.policy) else None
        p50, p99 = r.ttft(0.5), r.ttft(0.99)
        ratio = p99 / p99_ref if p99 and p99_ref else None
        lines.append(
            f"| {r.name} | {r.policy} | {r.batch_tokens_per_s:.0f} | "
            f"{'' if share is None else f'{100 * share:.0f} %'} | "
            f"{'' if p50 is None else f'{p50:.0f} ms'} | "
            f"{'' if p99 is None else f'{p99:.0f} ms'} | "
            f"{'' if ratio is None else f'{ratio:.2f}x'} | {r.live_errors}/{r.live_sent} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--upstream", help="a running vLLM's URL (default: start one per policy)")
    p.add_argument("--model", default="demo", help="the served model name to ask for")
    p.add_argument("--venv", default=".venv-vllm", help="the vLLM venv (make test-vllm's)")
    p.add_argument("--rows", default="live,naive,backfill,engine-priority,backfill+priority")
    p.add_argument("--seats", type=int, default=Config.seats, help="vLLM --max-num-seqs")
    p.add_argument("--live-rate", type=float, default=Config.live_rate, help="live requests/s")
    p.add_argument("--window", type=float, default=Config.window_s, help="seconds per row")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    clear_settings_env()
    result = asyncio.run(run(args))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
