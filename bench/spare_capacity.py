"""Spare capacity, measured: how much of a GPU server's idle room a batch fills, and what that
costs live traffic. Issues 9 and 26.

    .venv/bin/python -m bench.spare_capacity --trace bursty --reps 3 \\
        --modes live-gw,ideal:2,ideal:4,cap:8,first-round,seat-aware,preempt-restart,preempt

The upstream is the simulator in GPU mode (`tools.sim.gpu`, continuous batching, priority
scheduling policy). One open-loop live workload (`bench.spare_workload`: `--trace` bursty, steady
or step, `--duration` seconds), seeded, is replayed identically in every mode of a repetition;
each of the `--reps` repetitions has its own seed. Each mode adds a different batch load next to
it (`bench.spare_loads`):

- `live`: nothing, live traffic straight to the simulator;
- `live-gw`: nothing, live traffic through the gateway's proxy (the reference of the ratio
  column when present: the backfill rows pay the same proxy hop);
- `naive:C`: a client sending batch requests straight to the server, C at a time, as users do
  without backfill;
- `ideal:K`: the ideal preempting client, in the replay's process: knows the live count
  exactly, keeps K seats free, cancels its youngest requests at once when live traffic needs
  their seats, and sends them again later. Its batch requests need no gateway; its row's live
  traffic still goes through the gateway's proxy, like the live-gw and backfill rows, so every
  ratio against live-gw measures the batch's cost alone (with live traffic straight to the
  simulator the ideal row would be spared the proxy hop, ~15 ms at p50, that the others pay);
- `cap:N`: backfill (the real stack: Temporal dev server, worker and api processes) with "Batch
  lines at once" = N and no other gate;
- `first-round`: backfill with the first round of gates (cap 12, yield to live traffic at 2,
  server load waiting > 0 or running > 10, priority hint 10);
- `seat-aware`: backfill with deploy/examples/batch-scheduling/bursty-vllm.json minus `preempt`;
- `preempt`: backfill with that file as shipped (seat-aware admission and preemptive yield; a
  preempted line resumes, `preempt.resume` on by default: it keeps its partial answer and its
  next run continues it, decision 0036);
- `preempt-restart`: the same with `preempt.resume` off (a preempted line runs again from its
  first token, as before decision 0036);
- `--mode-json '{"name": ..., "kind": "backfill", "settings": {...}}'`: any settings document
  (`PUT .../batch-scheduling`) as a backfill mode.

Live traffic goes through the gateway in every row except `live` and `naive:*`.

Capacity is measured first by a saturation run: 2 × `max_num_seqs` batch-shaped requests kept in
flight for `--capacity-s` seconds after a warm-up, tokens generated per second. Spare capacity
(per repetition) = capacity − the live-only run's live tokens/s over the window. A mode's batch
share = its batch tokens/s over the window ÷ spare. Tokens are counted by the simulator at each
engine step, per class (live, or batch: requests carrying `X-Backfill-Batch`), so requests still
running when the window ends count for the tokens they produced inside it. Wasted = the tokens of
batch requests aborted during the window (their client closed the connection), less those a
later request sent back as the partial answer it continues (a resumed line: the simulator matches
a continuation with the aborted request it continues, `ClassCounters.kept_at`; for a mode whose
lines resume, continuations are waited for up to `RESUME_GRACE_S` after the window, since a line
preempted in its last burst continues after it), as a share of the batch tokens generated in it.
Useful share = the batch tokens kept (generated less wasted) per second ÷ spare: what the batch
harvests of the spare capacity, thrown-away tokens not counted.

Live TTFT is measured by the client (first content chunk) and by the simulator (arrival to first
token, no proxy in it). Writes every run as JSON (`--out`) and prints a table of the medians over
the repetitions.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import httpx

from bench.common import clear_settings_env, log
from bench.spare_loads import (
    CHAT,
    BackfillBatch,
    BatchLoad,
    IdealClient,
    InFlight,
    NaiveClient,
    NoBatch,
)
from bench.spare_workload import TRACES, Arrival, Workload, chat_body
from tools.sim import SimServer
from tools.sim.gpu import ClassCounters, GpuEngine, LatencyRecord, percentile

__all__ = ["Mode", "ModeResult", "ModeSummary", "Workload", "main", "summarize"]

ModeKind = Literal["live_only", "naive", "ideal", "backfill"]
EXAMPLE = Path(__file__).resolve().parents[1] / "deploy/examples/batch-scheduling/bursty-vllm.json"
"""The shipped settings example the `seat-aware` and `preempt` presets measure."""
FIRST_ROUND: dict[str, Any] = {
    "max_concurrent_lines": 12,
    "yield_to_live_traffic": {"pause_at_in_flight": 2},
    "server_load": {"metrics_url": "{sim_url}/metrics", "max_waiting": 0, "max_running": 10},
    "priority_hint": 10,
}
"""The first round of gates, the best row of docs/performance.md's table before seat-aware
admission."""
LIVE, LIVE_GW = "live only", "live only (gateway)"
SLOWEST = 8
RESUME_GRACE_S = 30.0
"""After the window of a mode whose preempted lines resume, how long its aborted batch requests
are given to be continued (a line preempted in the window's last burst waits for a seat and
continues after it; its tokens are kept, not wasted)."""
"""Live requests kept per run for a post-mortem of the tail (`ModeResult.slowest_live`)."""


# ---- modes ---------------------------------------------------------------------------------------


@dataclass
class Mode:
    """One row of the table. `settings` is a backfill route's settings document."""

    name: str
    kind: ModeKind
    concurrency: int | None = None
    settings: dict[str, Any] | None = None
    via_gateway: bool = False
    keep_free: int | None = None
    """`ideal`: seats the ideal client keeps free."""

    @property
    def resumes(self) -> bool:
        """A backfill mode whose preempted lines continue (`preempt.resume`, on by default)."""
        preempt = (self.settings or {}).get("preempt")
        return self.kind == "backfill" and isinstance(preempt, dict) and preempt.get("resume", True)

    @classmethod
    def parse(cls, spec: str) -> Mode:
        kind, _, arg = spec.partition(":")
        if kind == "live":
            return cls(LIVE, "live_only")
        if kind == "live-gw":
            return cls(LIVE_GW, "live_only", via_gateway=True)
        if kind == "naive" and arg.isdigit():
            return cls(f"naive client, {arg} at a time", "naive", concurrency=int(arg))
        if kind == "ideal" and arg.isdigit():
            name = f"ideal client, {arg} kept free"
            return cls(name, "ideal", keep_free=int(arg), via_gateway=True)
        if kind == "cap" and arg.isdigit():
            return cls(
                f"backfill, cap {arg}", "backfill", settings={"max_concurrent_lines": int(arg)}
            )
        if kind == "first-round":
            name = "backfill, cap 12, yield 2, waiting>0, running>10, prio 10"
            return cls(name, "backfill", settings=FIRST_ROUND)
        if kind in ("seat-aware", "preempt", "preempt-restart"):
            example = json.loads(EXAMPLE.read_text())
            if kind == "seat-aware":
                example.pop("preempt", None)
                return cls(
                    f"backfill, {EXAMPLE.name} without preempt", "backfill", settings=example
                )
            if kind == "preempt-restart":
                example["preempt"] = {**example.get("preempt", {}), "resume": False}
                name = f"backfill, {EXAMPLE.name}, preempted lines restart"
                return cls(name, "backfill", settings=example)
            return cls(f"backfill, {EXAMPLE.name}", "backfill", settings=example)
        raise ValueError(
            f"unknown mode {spec!r} (live, live-gw, naive:C, ideal:K, cap:N, first-round, "
            "seat-aware, preempt-restart, preempt)"
        )


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
    arrivals: list[Arrival], base_url: str, headers: dict[str, str], live: InFlight
) -> list[LiveOutcome]:
    """Each arrival at its time; `live` counts those sent and not yet ended."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=base_url, timeout=600, limits=limits) as http:
        t0 = time.monotonic()

        async def at(a: Arrival) -> LiveOutcome:
            await asyncio.sleep(max(0.0, t0 + a.at_s - time.monotonic()))
            live.n += 1
            try:
                return await one_live(http, a, headers)
            finally:
                live.n -= 1

        return list(await asyncio.gather(*(at(a) for a in arrivals)))


Dist = dict[str, float | None]


@dataclass
class ModeResult:
    """One run of one mode."""

    name: str
    kind: str
    rep: int
    seed: int
    window_s: float
    live_sent: int
    live_errors: int
    live_ttft_ms: Dist
    live_e2e_ms: Dist
    sim_live_ttft_ms: Dist
    sim_batch_e2e_ms: Dist
    live_tokens_per_s: float
    batch_tokens_per_s: float
    batch_tokens: int
    batch_aborted: int
    batch_aborted_tokens: int
    """Tokens the batch requests aborted in the window had generated."""
    peak_waiting: int
    live_ttft_ms_by_phase: dict[str, Dist] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    live_error_kinds: dict[str, int] = field(default_factory=dict)
    """Live errors by kind (an HTTP status, or the client's exception)."""
    slowest_live: list[dict[str, Any]] = field(default_factory=list)
    """For a post-mortem of the tail: the live requests with the longest TTFT at the simulator
    (seconds after the window's start, TTFT and time queued for a seat, ms) and the batch
    requests aborted from a second before each arrived to its first token."""
    batch_kept_tokens: int = 0
    """Of `batch_aborted_tokens`, those a later request continued (a resumed line): kept."""
    batch_share_of_spare: float | None = None
    useful_share_of_spare: float | None = None
    """Batch tokens kept (generated less wasted) per second ÷ spare."""
    ttft_p99_vs_reference: float | None = None
    """Live TTFT p99 ÷ the same repetition's reference row's (`live-gw` if run, else `live`)."""

    @property
    def wasted_tokens(self) -> int:
        """Batch tokens generated and thrown away: aborted and not continued."""
        return max(0, self.batch_aborted_tokens - self.batch_kept_tokens)

    @property
    def wasted_share(self) -> float | None:
        """Wasted batch tokens ÷ batch tokens generated in the window."""
        return self.wasted_tokens / self.batch_tokens if self.batch_tokens else None


async def continued(batch: ClassCounters, until: float, within: float) -> None:
    """Wait until every batch request aborted with tokens by `until` has been continued (or
    `within` seconds pass: a line that restarted is never continued)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        aborted = sum(1 for t, n in batch.aborted_tokens_at if t <= until and n > 0)
        if sum(1 for t, _ in batch.kept_at if t <= until) >= aborted:
            return
        await asyncio.sleep(0.2)


def slowest(
    live: list[LatencyRecord], aborted_at: list[float], since: float, n: int = SLOWEST
) -> list[dict[str, Any]]:
    """The `n` live records with the longest TTFT, each with the batch aborts from a second
    before its arrival to its first token (`ModeResult.slowest_live`)."""
    out = []
    for r in sorted(live, key=lambda r: r.ttft_s, reverse=True)[:n]:
        before = [a for a in aborted_at if r.arrival - 1.0 <= a <= r.arrival + r.ttft_s]
        out.append(
            {
                "at_s": round(r.arrival - since, 3),
                "ttft_ms": round(1000 * r.ttft_s, 1),
                "queued_ms": round(1000 * r.queued_s, 1),
                "batch_aborts_ms": [round(1000 * (a - r.arrival), 1) for a in before],
            }
        )
    return out


def dist_ms(seconds: list[float]) -> Dist:
    ms = [s * 1000 for s in seconds]
    return {
        "p50": percentile(ms, 50),
        "p95": percentile(ms, 95),
        "p99": percentile(ms, 99),
        "mean": _mean(ms),
    }


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def median(values: list[float | None]) -> float | None:
    """The median of the values that exist (None when none does)."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


@dataclass
class ModeSummary:
    """One row of the table: a mode's medians over its runs."""

    name: str
    runs: int
    live_ttft_ms: Dist
    """Median over the runs of each run's p50, p95 and p99."""
    ttft_p99_vs_reference: float | None
    batch_tokens_per_s: float | None
    batch_share_of_spare: float | None
    useful_share_of_spare: float | None
    wasted_share: float | None
    live_errors: int
    """Summed over the runs."""


def summarize(results: list[ModeResult]) -> list[ModeSummary]:
    """Per mode (in the order first run), the median of each figure over its runs."""
    by_name: dict[str, list[ModeResult]] = {}
    for r in results:
        by_name.setdefault(r.name, []).append(r)
    return [
        ModeSummary(
            name=name,
            runs=len(runs),
            live_ttft_ms={
                q: median([r.live_ttft_ms[q] for r in runs]) for q in ("p50", "p95", "p99")
            },
            ttft_p99_vs_reference=median([r.ttft_p99_vs_reference for r in runs]),
            batch_tokens_per_s=median([r.batch_tokens_per_s for r in runs]),
            batch_share_of_spare=median([r.batch_share_of_spare for r in runs]),
            useful_share_of_spare=median([r.useful_share_of_spare for r in runs]),
            wasted_share=median([r.wasted_share for r in runs]),
            live_errors=sum(r.live_errors for r in runs),
        )
        for name, runs in by_name.items()
    ]


def reference_name(results: list[ModeResult]) -> str:
    """The live-only row spare capacity and the ratio are read against: `live-gw` if it ran,
    else `live`, else the first live-only row."""
    names = {r.name for r in results}
    for name in (LIVE_GW, LIVE):
        if name in names:
            return name
    return next(r.name for r in results if r.kind == "live_only")


def compare(results: list[ModeResult], capacity_tokens_per_s: float) -> dict[int, float]:
    """Fill in each run's share of spare and p99 ratio against its repetition's reference run;
    returns the spare capacity per repetition."""
    ref_name = reference_name(results)
    refs = {r.rep: r for r in results if r.name == ref_name}
    spare: dict[int, float] = {}
    for r in results:
        ref = refs[r.rep]
        spare[r.rep] = capacity_tokens_per_s - ref.live_tokens_per_s
        s = spare[r.rep]
        r.batch_share_of_spare = r.batch_tokens_per_s / s if s > 0 else None
        kept = r.batch_tokens_per_s * (1 - (r.wasted_share or 0.0))
        r.useful_share_of_spare = kept / s if s > 0 else None
        p99, ref_p99 = r.live_ttft_ms["p99"], ref.live_ttft_ms["p99"]
        r.ttft_p99_vs_reference = p99 / ref_p99 if p99 and ref_p99 else None
    return spare


@dataclass
class Bench:
    workload: Workload
    sim: SimServer
    stack: Any = None
    batch_lines: int = 600
    live: InFlight = field(default_factory=InFlight)

    def load_for(self, mode: Mode) -> BatchLoad:
        """The hook: each mode kind builds its batch load here."""
        if mode.kind == "live_only":
            return NoBatch()
        if mode.kind == "naive":
            assert mode.concurrency
            return NaiveClient(self.sim, self.workload, mode.concurrency)
        if mode.kind == "ideal":
            assert mode.keep_free is not None
            return IdealClient(self.sim, self.workload, mode.keep_free, self.live)
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

    async def run_mode(self, mode: Mode, rep: int, seed: int) -> ModeResult:
        w = replace(self.workload, seed=seed)
        schedule = w.schedule()
        log(f"rep {rep} mode {mode.name}: starting its batch load")
        load = self.load_for(mode)
        await load.start()
        engine = self.engine
        base_url, headers = self.live_target(mode)
        engine.log.reset()
        engine.peak_waiting = engine.waiting
        log(f"rep {rep} mode {mode.name}: {len(schedule)} live requests over {w.window_s:.0f}s")
        window: dict[str, float] = {}

        async def snapshot() -> None:
            await asyncio.sleep(w.window_s)
            window["live"] = engine.log.live.generated_tokens
            window["batch"] = engine.log.batch.generated_tokens
            window["batch_aborted"] = engine.log.batch.aborted
            window["batch_aborted_tokens"] = engine.log.batch.aborted_tokens
            window["end"] = time.monotonic()
            window["seconds"] = window["end"] - engine.log.since

        snap = asyncio.create_task(snapshot())
        try:
            outcomes = await replay(schedule, base_url, headers, self.live)
            await snap
            if mode.resumes:
                await continued(engine.log.batch, window["end"], RESUME_GRACE_S)
            batch = engine.log.batch
            window["batch_kept_tokens"] = sum(n for t, n in batch.kept_at if t <= window["end"])
        finally:
            snap.cancel()
            records = list(engine.log.records)
            aborted_at = list(engine.log.batch.aborted_at)
            since = engine.log.since
            peak_waiting = engine.peak_waiting
            extra = await load.stop()
        ok = [o for o in outcomes if o.error is None]
        phases: dict[str, list[float]] = {}
        for a, o in zip(schedule, outcomes, strict=True):
            if o.ttft_s is not None:
                phases.setdefault(a.phase, []).append(o.ttft_s)
        live_recs = [r for r in records if r.traffic == "live"]
        batch_recs = [r for r in records if r.traffic == "batch"]
        result = ModeResult(
            name=mode.name,
            kind=mode.kind,
            rep=rep,
            seed=seed,
            window_s=window["seconds"],
            live_sent=len(outcomes),
            live_errors=len(outcomes) - len(ok),
            live_ttft_ms=dist_ms([o.ttft_s for o in ok if o.ttft_s is not None]),
            live_e2e_ms=dist_ms([o.e2e_s for o in ok if o.e2e_s is not None]),
            sim_live_ttft_ms=dist_ms([r.ttft_s for r in live_recs]),
            sim_batch_e2e_ms=dist_ms([r.e2e_s for r in batch_recs]),
            live_tokens_per_s=window["live"] / window["seconds"],
            batch_tokens_per_s=window["batch"] / window["seconds"],
            batch_tokens=int(window["batch"]),
            batch_aborted=int(window["batch_aborted"]),
            batch_aborted_tokens=int(window["batch_aborted_tokens"]),
            batch_kept_tokens=int(window["batch_kept_tokens"]),
            peak_waiting=peak_waiting,
            live_ttft_ms_by_phase={p: dist_ms(v) for p, v in phases.items()},
            extra=extra,
            live_error_kinds=dict(Counter(o.error for o in outcomes if o.error is not None)),
            slowest_live=slowest(live_recs, aborted_at, since),
        )
        log(f"rep {rep} mode {mode.name}: {json.dumps(asdict(result))}")
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
async def environment(
    workload: Workload, need_stack: bool, workers: int = 1
) -> AsyncIterator[Bench]:
    """The simulator, and (for backfill modes) the real stack with it as the route upstream,
    `workers` activity workers and preemptive yield's direct channel on (the api finds the
    workers on the task queue; they count each other's lines)."""
    if not need_stack:
        async with SimServer(workload.sim_config()) as sim:
            yield Bench(workload, sim)
        return
    from bench.common import dev_server
    from tests.e2e.stack import Stack
    from tools.dev.procs import backfill_argv, free_port

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
            stack.extra_env["BACKFILL_PREEMPT_TOKEN"] = secrets.token_hex(32)
            try:
                await stack.sim.start()
                stack.write_config()
                for _ in range(workers):
                    stack.start_worker()
                stack.api.start(backfill_argv("api"), stack.env(), stack.tmp / "api.log")
                await stack.wait_healthy()
                yield Bench(workload, stack.sim, stack=stack)
            finally:
                await stack.stop()


def table(
    workload: Workload,
    capacity: dict[str, Any],
    spare: float | None,
    reference: str,
    rows: list[ModeSummary],
) -> str:
    def f(v: float | None, fmt: str = "{:.0f}") -> str:
        return "—" if v is None else fmt.format(v)

    def pct(v: float | None) -> str:
        return f(None if v is None else 100 * v, "{:.0f} %")

    head = (
        f"trace {workload.trace}, {workload.duration_s:.0f} s per run; capacity "
        f"{capacity['tokens_per_s']:.1f} tok/s (saturation; modelled decode "
        f"{capacity['modelled_decode_tokens_per_s']:.1f}), spare {f(spare, '{:.1f}')} tok/s "
        "(median over the repetitions); medians over each mode's runs\n"
    )
    cols = (
        "| mode | runs | live TTFT p50 ms | p95 ms | p99 ms | p99 vs "
        f"{reference} | batch tok/s | batch share of spare | useful share | wasted "
        "(% of batch tokens) | live errors |"
    )
    lines = [head, cols, "|" + "---|" * 11]
    for r in rows:
        ttft = r.live_ttft_ms
        lines.append(
            f"| {r.name} | {r.runs} | {f(ttft['p50'])} | {f(ttft['p95'])} | {f(ttft['p99'])} "
            f"| {f(r.ttft_p99_vs_reference, '{:.2f}×')} | {f(r.batch_tokens_per_s, '{:.1f}')} "
            f"| {pct(r.batch_share_of_spare)} | {pct(r.useful_share_of_spare)} "
            f"| {pct(r.wasted_share)} | {r.live_errors} |"
        )
    return "\n".join(lines)


def uses_gateway(modes: list[Mode]) -> bool:
    """Whether any row needs the stack (a backfill row, or live traffic through the gateway)."""
    return any(m.kind == "backfill" or m.via_gateway for m in modes)


def modes_from(args: argparse.Namespace) -> list[Mode]:
    modes = [Mode.parse(s) for s in args.modes.split(",") if s]
    modes += [Mode(**json.loads(m)) for m in args.mode_json]
    if not any(m.kind == "live_only" for m in modes):
        # The reference every share and ratio needs: through the gateway when any row is.
        modes.insert(0, Mode.parse("live-gw" if uses_gateway(modes) else "live"))
    return modes


async def run(args: argparse.Namespace) -> dict[str, Any]:
    w = Workload(
        max_num_seqs=args.max_num_seqs,
        step_base_ms=args.step_base_ms,
        step_per_seq_ms=args.step_per_seq_ms,
        trace=args.trace,
        duration_s=args.duration,
        cycles=args.cycles,
        busy_fill=args.busy_fill,
        quiet_fill=args.quiet_fill,
        seed=args.seed,
    )
    modes = modes_from(args)
    need_stack = uses_gateway(modes)
    segments = [asdict(s) for s in w.segments()]
    log(f"workload: trace {w.trace}, {w.duration_s:.0f}s, segments {segments}")
    async with environment(w, need_stack, args.workers) as bench:
        bench.batch_lines = args.batch_lines
        capacity = await bench.measure_capacity(args.capacity_s)
        log(f"capacity: {capacity}")
        results = [
            await bench.run_mode(m, rep, args.seed + rep) for rep in range(args.reps) for m in modes
        ]
    spare = compare(results, capacity["tokens_per_s"])
    summary = summarize(results)
    reference = reference_name(results)
    spare_median = median(list(spare.values()))
    return {
        "command": " ".join(sys.argv),
        "workload": asdict(w),
        "workers": args.workers,
        "segments": segments,
        "capacity": capacity,
        "reference": reference,
        "spare_tokens_per_s": spare,
        "summary": [asdict(s) for s in summary],
        "runs": [
            {**asdict(r), "wasted_tokens": r.wasted_tokens, "wasted_share": r.wasted_share}
            for r in results
        ],
        "table": table(w, capacity, spare_median, reference, summary),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    d = Workload()
    p.add_argument(
        "--modes",
        default="live-gw,ideal:2,ideal:4,cap:8,first-round,seat-aware,preempt-restart,preempt",
        help="comma-separated (see above)",
    )
    p.add_argument("--mode-json", action="append", default=[], help="a Mode as JSON (repeatable)")
    p.add_argument("--trace", choices=TRACES, default=d.trace)
    p.add_argument("--duration", type=float, default=d.duration_s, help="seconds per run")
    p.add_argument("--reps", type=int, default=3, help="runs of each mode (seed, seed+1, ...)")
    p.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs)
    p.add_argument("--step-base-ms", type=float, default=d.step_base_ms)
    p.add_argument("--step-per-seq-ms", type=float, default=d.step_per_seq_ms)
    p.add_argument("--cycles", type=int, default=d.cycles, help="bursty: quiet/busy cycles")
    p.add_argument("--busy-fill", type=float, default=d.busy_fill)
    p.add_argument("--quiet-fill", type=float, default=d.quiet_fill)
    p.add_argument("--seed", type=int, default=d.seed, help="the first repetition's seed")
    p.add_argument("--capacity-s", type=float, default=20.0)
    p.add_argument("--batch-lines", type=int, default=600, help="lines per backfill batch")
    p.add_argument("--workers", type=int, default=1, help="backfill's activity workers")
    p.add_argument("--out", type=Path, help="write the result as JSON here")
    p.add_argument("--timeout", type=float, default=4 * 3600, help="whole run, seconds")
    args = p.parse_args(argv)
    if args.reps < 1:
        p.error("--reps must be at least 1")
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
