"""Spare capacity, measured: how much of a GPU server's idle room a batch fills, and what that
costs live traffic. Issue 9.

    .venv/bin/python -m bench.spare_capacity --modes live,naive:16,naive:4
    .venv/bin/python -m bench.spare_capacity --modes live,naive:16,cap:4,cap:8,cap:16

The upstream is the simulator in GPU mode (`backfill.sim.gpu`, continuous batching, priority
scheduling policy). One open-loop live workload, seeded, is replayed identically in every mode:
streaming chat requests arriving as a Poisson process whose rate follows a bursty curve (quiet
phases, then busy phases whose live load alone nearly fills the server's `max_num_seqs`). Each
mode adds a different batch load next to it:

- `live`: nothing (the reference for live latency, and the live load the spare is computed from);
- `naive:C`: a client sending batch requests straight to the server, C at a time, as users do
  without backfill;
- `cap:N`: backfill (the real stack: Temporal dev server, worker and api processes) with
  "Batch lines at once" = N and no other gate; live traffic goes through the gateway's proxy;
- `live-gw`: live only, through the gateway (the proxy's own cost, for the backfill rows);
- `--mode-json '{"name": ..., "kind": "backfill", "settings": {...}}'`: any settings document
  (`PUT .../batch-scheduling`) as a backfill mode, e.g. yield + server load + priority hint once
  the gates exist.

Capacity is measured first by a saturation run: 2 × `max_num_seqs` batch-shaped requests kept in
flight for `--capacity-s` seconds after a warm-up, tokens generated per second. Spare capacity
= capacity − the live-only run's live tokens/s over the window. A mode's batch share = its batch
tokens/s over the window ÷ spare. Tokens are counted by the simulator at each engine step, per
class (live, or batch: requests carrying `X-Backfill-Batch`), so requests still running when the
window ends count for the tokens they produced inside it.

Live TTFT is measured by the client (first content chunk) and by the simulator (arrival to first
token, no proxy in it). Writes the result as JSON (`--out`) and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import httpx

from backfill.sim import BATCH_HEADER, GpuConfig, SimConfig, SimServer
from backfill.sim.gpu import GpuEngine, percentile
from bench.common import clear_settings_env, log

ModeKind = Literal["live_only", "naive", "backfill"]
CHAT = "/v1/chat/completions"


# ---- the workload --------------------------------------------------------------------------------


@dataclass
class Workload:
    """The simulated GPU and the traffic replayed against it."""

    max_num_seqs: int = 16
    step_base_ms: float = 40.0
    step_per_seq_ms: float = 2.5
    prefill_per_token_ms: float = 0.05
    kv_cache_tokens: int = 65536
    live_prompt_words: tuple[int, int] = (40, 160)
    live_output_tokens: tuple[int, int] = (24, 72)
    batch_prompt_words: int = 100
    batch_output_tokens: int = 128
    quiet_s: float = 15.0
    busy_s: float = 15.0
    cycles: int = 3
    quiet_fill: float = 0.15
    """Live sequences running in a quiet phase, as a fraction of `max_num_seqs` (offered load)."""
    busy_fill: float = 0.85
    """The same in a busy phase: the live load alone nearly fills the server."""
    seed: int = 1

    def gpu(self) -> GpuConfig:
        return GpuConfig(
            step_base_ms=self.step_base_ms,
            step_per_seq_ms=self.step_per_seq_ms,
            prefill_per_token_ms=self.prefill_per_token_ms,
            kv_cache_tokens=self.kv_cache_tokens,
        )

    def sim_config(self) -> SimConfig:
        return SimConfig(
            model_names=["demo"],
            max_num_seqs=self.max_num_seqs,
            scheduling_policy="priority",
            gpu=self.gpu(),
        )

    @property
    def window_s(self) -> float:
        return self.cycles * (self.quiet_s + self.busy_s)

    def live_rate(self, fill: float) -> float:
        """Arrivals/s that keep `fill × max_num_seqs` live sequences running (Little's law)."""
        running = fill * self.max_num_seqs
        engine = GpuEngine(self.gpu(), self.max_num_seqs, use_priority=False)
        mean_out = sum(self.live_output_tokens) / 2
        seconds = (mean_out + 1) * engine.step_ms(round(running)) / 1000.0
        return running / seconds

    def schedule(self) -> list[Arrival]:
        rng = random.Random(self.seed)
        out: list[Arrival] = []
        t = 0.0
        for _ in range(self.cycles):
            for length, fill in ((self.quiet_s, self.quiet_fill), (self.busy_s, self.busy_fill)):
                end, rate = t + length, self.live_rate(fill)
                while (t := t + rng.expovariate(rate)) < end:
                    words = rng.randint(*self.live_prompt_words)
                    tokens = rng.randint(*self.live_output_tokens)
                    out.append(Arrival(t, words, tokens, busy=fill == self.busy_fill))
                t = end
        return out


@dataclass(frozen=True)
class Arrival:
    at_s: float
    prompt_words: int
    output_tokens: int
    busy: bool = False
    """Whether it arrives in a busy phase."""


def chat_body(words: int, tokens: int, **extra: Any) -> dict[str, Any]:
    prompt = " ".join(f"w{i}" for i in range(words))
    return {
        "model": "demo",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": tokens,
        **extra,
    }


# ---- modes ---------------------------------------------------------------------------------------


@dataclass
class Mode:
    """One row of the table. `settings` is a backfill route's settings document."""

    name: str
    kind: ModeKind
    concurrency: int | None = None
    settings: dict[str, Any] | None = None
    via_gateway: bool = False

    @classmethod
    def parse(cls, spec: str) -> Mode:
        kind, _, arg = spec.partition(":")
        if kind == "live":
            return cls("live only", "live_only")
        if kind == "live-gw":
            return cls("live only (gateway)", "live_only", via_gateway=True)
        if kind == "naive" and arg.isdigit():
            return cls(f"naive client, {arg} at a time", "naive", concurrency=int(arg))
        if kind == "cap" and arg.isdigit():
            return cls(
                f"backfill, cap {arg}", "backfill", settings={"max_concurrent_lines": int(arg)}
            )
        raise ValueError(f"unknown mode {spec!r} (live, live-gw, naive:C, cap:N)")


class BatchLoad(Protocol):
    """What a mode adds next to live traffic. `start` returns once batch work is running."""

    async def start(self) -> None: ...

    async def stop(self) -> dict[str, Any]: ...


class NoBatch:
    async def start(self) -> None:
        return None

    async def stop(self) -> dict[str, Any]:
        return {}


class NaiveClient:
    """`concurrency` workers, each sending one batch request after another straight to the sim."""

    def __init__(self, sim: SimServer, workload: Workload, concurrency: int) -> None:
        self.sim, self.workload, self.concurrency = sim, workload, concurrency
        self.done = self.failed = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._http = httpx.AsyncClient(
            base_url=sim.url,
            timeout=600,
            limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency),
        )

    async def _worker(self) -> None:
        w = self.workload
        body = chat_body(w.batch_prompt_words, w.batch_output_tokens)
        while True:
            r = await self._http.post(CHAT, json=body, headers={BATCH_HEADER: "naive"})
            if r.status_code == 200:
                self.done += 1
            else:
                self.failed += 1

    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self._worker()) for _ in range(self.concurrency)]
        engine = self.sim.app.engine
        assert engine is not None
        await wait_for(lambda: engine.running > 0, 30, "naive batch requests running")

    async def stop(self) -> dict[str, Any]:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._http.aclose()
        engine = self.sim.app.engine
        assert engine is not None  # the sim notices the disconnects and aborts the requests
        await wait_for(lambda: engine.running + engine.waiting == 0, 30, "naive requests gone")
        return {"batch_requests_finished": self.done, "batch_requests_failed": self.failed}


class BackfillBatch:
    """A batch through the real gateway: route settings PUT, file uploaded, batch created."""

    def __init__(self, stack: Any, workload: Workload, settings: dict[str, Any], lines: int):
        self.stack, self.workload, self.settings, self.lines = stack, workload, settings, lines
        self.batch_id: str | None = None

    async def start(self) -> None:
        from tests.e2e.stack import auth

        stack, w = self.stack, self.workload
        url = f"{stack.api_url}/api/v1/platform/deployments/{stack.route_id}/batch-scheduling"
        # "{sim_url}" in a setting (e.g. server_load.metrics_url) is the simulator's base URL.
        settings = json.loads(json.dumps(self.settings).replace("{sim_url}", stack.sim.url))
        async with httpx.AsyncClient(timeout=30) as http:
            r = await http.put(url, json=settings, headers=auth("sk-test-admin"))
            if r.status_code != 200:
                raise RuntimeError(f"settings refused: {r.status_code} {r.text}")
        body = chat_body(w.batch_prompt_words, w.batch_output_tokens)
        lines = [
            json.dumps({"custom_id": f"l{i}", "method": "POST", "url": CHAT, "body": body})
            for i in range(self.lines)
        ]
        client = stack.client()
        f = await client.files.create(
            file=("batch.jsonl", ("\n".join(lines) + "\n").encode()), purpose="batch"
        )
        batch = await client.batches.create(
            input_file_id=f.id, endpoint=CHAT, completion_window="24h"
        )
        self.batch_id = batch.id
        engine = stack.sim.app.engine
        await wait_for(lambda: engine.log.batch.generated_tokens > 0, 120, "batch lines running")

    async def stop(self) -> dict[str, Any]:
        client = self.stack.client()
        assert self.batch_id is not None
        batch = await client.batches.cancel(self.batch_id)
        sim_stats = self.stack.sim.app.stats
        await wait_for(lambda: sim_stats.batch.concurrent == 0, 600, "batch lines drained")
        batch = await client.batches.retrieve(self.batch_id)
        counts = batch.request_counts
        return {
            "batch_id": self.batch_id,
            "batch_status": batch.status,
            "batch_lines_completed": counts.completed if counts else None,
        }


async def wait_for(pred: Callable[[], bool], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {within:.0f}s")
        await asyncio.sleep(0.05)


# ---- live traffic and the measurement ------------------------------------------------------------


@dataclass
class LiveOutcome:
    ttft_s: float | None = None
    e2e_s: float | None = None
    error: str | None = None


async def one_live(http: httpx.AsyncClient, a: Arrival, headers: dict[str, str]) -> LiveOutcome:
    body = chat_body(a.prompt_words, a.output_tokens, stream=True)
    t0 = time.monotonic()
    out = LiveOutcome()
    try:
        async with http.stream("POST", CHAT, json=body, headers=headers) as r:
            if r.status_code != 200:
                await r.aread()
                return LiveOutcome(error=f"{r.status_code}")
            async for line in r.aiter_lines():
                if out.ttft_s is None and line.startswith("data: {") and '"content"' in line:
                    if json.loads(line[6:])["choices"][0]["delta"].get("content"):
                        out.ttft_s = time.monotonic() - t0
        out.e2e_s = time.monotonic() - t0
    except httpx.HTTPError as e:
        out.error = type(e).__name__
    return out


async def replay(
    arrivals: list[Arrival], base_url: str, headers: dict[str, str]
) -> list[LiveOutcome]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=base_url, timeout=600, limits=limits) as http:
        t0 = time.monotonic()

        async def at(a: Arrival) -> LiveOutcome:
            await asyncio.sleep(max(0.0, t0 + a.at_s - time.monotonic()))
            return await one_live(http, a, headers)

        return list(await asyncio.gather(*(at(a) for a in arrivals)))


@dataclass
class ModeResult:
    name: str
    kind: str
    window_s: float
    live_sent: int
    live_errors: int
    live_ttft_ms: dict[str, float | None]
    live_e2e_ms: dict[str, float | None]
    sim_live_ttft_ms: dict[str, float | None]
    sim_batch_e2e_ms: dict[str, float | None]
    live_tokens_per_s: float
    batch_tokens_per_s: float
    peak_waiting: int
    live_ttft_ms_quiet: dict[str, float | None] = field(default_factory=dict)
    live_ttft_ms_busy: dict[str, float | None] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    batch_share_of_spare: float | None = None
    ttft_p99_vs_live_only: float | None = None


def dist_ms(seconds: list[float]) -> dict[str, float | None]:
    ms = [s * 1000 for s in seconds]
    return {"p50": percentile(ms, 50), "p99": percentile(ms, 99), "mean": _mean(ms)}


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


@dataclass
class Bench:
    workload: Workload
    sim: SimServer
    stack: Any = None
    batch_lines: int = 600
    schedule: list[Arrival] = field(default_factory=list)

    def load_for(self, mode: Mode) -> BatchLoad:
        """The hook: each mode kind builds its batch load here."""
        if mode.kind == "live_only":
            return NoBatch()
        if mode.kind == "naive":
            assert mode.concurrency
            return NaiveClient(self.sim, self.workload, mode.concurrency)
        if self.stack is None:
            raise RuntimeError("backfill modes need the stack (started when one is requested)")
        assert mode.settings is not None
        return BackfillBatch(self.stack, self.workload, mode.settings, self.batch_lines)

    def live_target(self, mode: Mode) -> tuple[str, dict[str, str]]:
        if mode.kind == "backfill" or mode.via_gateway:
            from tests.e2e.stack import auth

            return self.stack.api_url, auth()
        return self.sim.url, {}

    @property
    def engine(self) -> GpuEngine:
        assert self.sim.app.engine is not None
        return self.sim.app.engine

    async def run_mode(self, mode: Mode) -> ModeResult:
        log(f"mode {mode.name}: starting its batch load")
        load = self.load_for(mode)
        await load.start()
        engine, w = self.engine, self.workload
        base_url, headers = self.live_target(mode)
        engine.log.reset()
        engine.peak_waiting = engine.waiting
        log(
            f"mode {mode.name}: replaying {len(self.schedule)} live requests over {w.window_s:.0f}s"
        )
        window: dict[str, float] = {}

        async def snapshot() -> None:
            await asyncio.sleep(w.window_s)
            window["live"] = engine.log.live.generated_tokens
            window["batch"] = engine.log.batch.generated_tokens
            window["seconds"] = time.monotonic() - engine.log.since

        snap = asyncio.create_task(snapshot())
        try:
            outcomes = await replay(self.schedule, base_url, headers)
            await snap
        finally:
            snap.cancel()
            records = list(engine.log.records)
            peak_waiting = engine.peak_waiting
            extra = await load.stop()
        ok = [o for o in outcomes if o.error is None]
        by_phase = {
            busy: [
                o.ttft_s
                for a, o in zip(self.schedule, outcomes, strict=True)
                if a.busy == busy and o.ttft_s is not None
            ]
            for busy in (False, True)
        }
        live_recs = [r for r in records if r.traffic == "live"]
        batch_recs = [r for r in records if r.traffic == "batch"]
        result = ModeResult(
            name=mode.name,
            kind=mode.kind,
            window_s=window["seconds"],
            live_sent=len(outcomes),
            live_errors=len(outcomes) - len(ok),
            live_ttft_ms=dist_ms([o.ttft_s for o in ok if o.ttft_s is not None]),
            live_e2e_ms=dist_ms([o.e2e_s for o in ok if o.e2e_s is not None]),
            sim_live_ttft_ms=dist_ms([r.ttft_s for r in live_recs]),
            sim_batch_e2e_ms=dist_ms([r.e2e_s for r in batch_recs]),
            live_tokens_per_s=window["live"] / window["seconds"],
            batch_tokens_per_s=window["batch"] / window["seconds"],
            peak_waiting=peak_waiting,
            live_ttft_ms_quiet=dist_ms(by_phase[False]),
            live_ttft_ms_busy=dist_ms(by_phase[True]),
            extra=extra,
        )
        log(f"mode {mode.name}: {json.dumps(asdict(result))}")
        return result

    async def measure_capacity(self, seconds: float, warmup: float = 5.0) -> dict[str, Any]:
        """Saturation: 2 × max_num_seqs batch-shaped requests in flight; tokens/s generated."""
        w = self.workload
        log(f"capacity: saturating with {2 * w.max_num_seqs} requests for {seconds:.0f}s")
        load = NaiveClient(self.sim, w, 2 * w.max_num_seqs)
        await load.start()
        await asyncio.sleep(warmup)
        engine = self.engine
        engine.log.reset()
        steps0, busy0 = engine.steps, engine.busy_s
        await asyncio.sleep(seconds)
        tokens = engine.log.batch.generated_tokens
        elapsed = time.monotonic() - engine.log.since
        steps, busy = engine.steps - steps0, engine.busy_s - busy0
        await load.stop()
        modelled = 1000.0 * w.max_num_seqs / engine.step_ms(w.max_num_seqs)
        return {
            "tokens_per_s": tokens / elapsed,
            "modelled_decode_tokens_per_s": modelled,
            "steps": steps,
            "mean_step_ms_modelled": 1000 * busy / steps if steps else None,
            "mean_step_ms_wall": 1000 * elapsed / steps if steps else None,
            "seconds": elapsed,
        }


# ---- the run -------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def environment(workload: Workload, need_stack: bool) -> AsyncIterator[Bench]:
    """The simulator, and (for backfill modes) the real stack with it as the route upstream."""
    if not need_stack:
        async with SimServer(workload.sim_config()) as sim:
            yield Bench(workload, sim)
        return
    from backfill.dev.procs import free_port
    from bench.common import dev_server
    from tests.e2e.stack import Stack

    keep = os.environ.get("BENCH_KEEP_DIR")  # keep the stack's logs for a post-mortem
    with (
        contextlib.nullcontext(tempfile.mkdtemp(prefix="bench-spare-"))
        if keep
        else tempfile.TemporaryDirectory(prefix="bench-spare-")
    ) as tmp:
        if keep:
            log(f"stack directory kept: {tmp}")
        async with dev_server(Path(tmp)) as server:
            stack = Stack(Path(tmp), server.address, cap=4, sim=workload.sim_config())
            # A fixed port, so the simulator is an approved upstream (for a server-load gate)
            # before the api and worker start.
            stack.sim = SimServer(workload.sim_config(), port=free_port())
            stack.route_sims = {route: stack.sim for route in stack.routes}
            stack.extra_env["GATEWAY_LOCAL_UPSTREAMS"] = stack.sim.base_url
            async with stack.running():
                yield Bench(workload, stack.sim, stack=stack)


def table(capacity: dict[str, Any], spare: float | None, rows: list[ModeResult]) -> str:
    def f(v: float | None, fmt: str = "{:.0f}") -> str:
        return "—" if v is None else fmt.format(v)

    spare_text = f(spare, "{:.1f}")
    head = (
        f"capacity {capacity['tokens_per_s']:.1f} tok/s (saturation; modelled decode "
        f"{capacity['modelled_decode_tokens_per_s']:.1f}), spare {spare_text} tok/s\n"
    )
    cols = (
        "| mode | live TTFT p50 ms | live TTFT p99 ms | p99 vs live only | p99 quiet / busy ms "
        "| sim live TTFT p99 ms "
        "| live tok/s | batch tok/s | batch share of spare | peak waiting |"
    )
    lines = [head, cols, "|" + "---|" * 10]
    for r in rows:
        share = None if r.batch_share_of_spare is None else 100 * r.batch_share_of_spare
        lines.append(
            f"| {r.name} | {f(r.live_ttft_ms['p50'])} | {f(r.live_ttft_ms['p99'])} "
            f"| {f(r.ttft_p99_vs_live_only, '{:.2f}×')} "
            f"| {f(r.live_ttft_ms_quiet['p99'])} / {f(r.live_ttft_ms_busy['p99'])} "
            f"| {f(r.sim_live_ttft_ms['p99'])} "
            f"| {r.live_tokens_per_s:.1f} | {r.batch_tokens_per_s:.1f} "
            f"| {f(share, '{:.0f} %')} "
            f"| {r.peak_waiting} |"
        )
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    w = Workload(
        max_num_seqs=args.max_num_seqs,
        step_base_ms=args.step_base_ms,
        step_per_seq_ms=args.step_per_seq_ms,
        quiet_s=args.quiet_s,
        busy_s=args.busy_s,
        cycles=args.cycles,
        busy_fill=args.busy_fill,
        quiet_fill=args.quiet_fill,
        seed=args.seed,
    )
    modes = [Mode.parse(s) for s in args.modes.split(",") if s]
    modes += [Mode(**json.loads(m)) for m in args.mode_json]
    if not any(m.kind == "live_only" and not m.via_gateway for m in modes):
        modes.insert(0, Mode.parse("live"))  # the reference every share and ratio needs
    need_stack = any(m.kind == "backfill" or m.via_gateway for m in modes)
    async with environment(w, need_stack) as bench:
        bench.schedule = w.schedule()
        bench.batch_lines = args.batch_lines
        log(
            f"workload: {len(bench.schedule)} live requests over {w.window_s:.0f}s; rates "
            f"{w.live_rate(w.quiet_fill):.2f}/s quiet, {w.live_rate(w.busy_fill):.2f}/s busy"
        )
        capacity = await bench.measure_capacity(args.capacity_s)
        log(f"capacity: {capacity}")
        rows = [await bench.run_mode(m) for m in modes]
    ref = next(r for r in rows if r.kind == "live_only" and r.name == "live only")
    spare = capacity["tokens_per_s"] - ref.live_tokens_per_s
    for r in rows:
        r.batch_share_of_spare = r.batch_tokens_per_s / spare if spare > 0 else None
        p99, ref_p99 = r.live_ttft_ms["p99"], ref.live_ttft_ms["p99"]
        r.ttft_p99_vs_live_only = p99 / ref_p99 if p99 and ref_p99 else None
    return {
        "command": " ".join(sys.argv),
        "workload": asdict(w),
        "capacity": capacity,
        "spare_tokens_per_s": spare,
        "modes": [asdict(r) for r in rows],
        "table": table(capacity, spare, rows),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    d = Workload()
    p.add_argument("--modes", default="live,naive:16,naive:4", help="comma-separated (see above)")
    p.add_argument("--mode-json", action="append", default=[], help="a Mode as JSON (repeatable)")
    p.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs)
    p.add_argument("--step-base-ms", type=float, default=d.step_base_ms)
    p.add_argument("--step-per-seq-ms", type=float, default=d.step_per_seq_ms)
    p.add_argument("--quiet-s", type=float, default=d.quiet_s)
    p.add_argument("--busy-s", type=float, default=d.busy_s)
    p.add_argument("--cycles", type=int, default=d.cycles)
    p.add_argument("--busy-fill", type=float, default=d.busy_fill)
    p.add_argument("--quiet-fill", type=float, default=d.quiet_fill)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--capacity-s", type=float, default=20.0)
    p.add_argument("--batch-lines", type=int, default=600, help="lines per backfill batch")
    p.add_argument("--out", type=Path, help="write the result as JSON here")
    p.add_argument("--timeout", type=float, default=3600, help="whole run, seconds")
    args = p.parse_args(argv)
    clear_settings_env()

    async def guarded() -> dict[str, Any]:
        task = asyncio.ensure_future(asyncio.wait_for(run(args), args.timeout))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGHUP):
            loop.add_signal_handler(sig, task.cancel)
        return await task

    result = asyncio.run(guarded())
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    print(result["table"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
