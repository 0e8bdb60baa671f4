"""Scheduler throughput: a real backfill batch through the route scheduler vs. bare Temporal.

    .venv/bin/python bench/scheduler_throughput.py --lines 3000 --cap 256

One run, one private dev server (headless, free port, temporary directory):

1. backfill: N lines to a simulator that answers at once, through BatchWorkflow and the route's
   RouteSchedulerWorkflow (cap = the route's max_concurrent_lines), the real worker in-process
   (`worker.main.running_worker`). Input written through the FileStore, the workflow started with
   the Temporal client as the api does, timed from start to result.
2. bare: one workflow running N trivial activities with the same window in flight, its own task
   queue and in-process worker (bench/bare_workflow.py).
3. bare-work: the same workflow whose activities each do a line's own work without backfill
   around it (bench/line_work.py: read the line, POST it to the simulator, commit the answer
   durably): what backfill's dispatch adds on top of the work any gateway must do.

Then a table (or --json): lines/s, activities/s, the ratios, history events, timings read back
from the histories (effective concurrency, per-activity latencies, continue-as-new pauses) and CPU
seconds of this process and of the dev server. See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench.*` from a plain run

from temporalio.client import Client, WorkflowHandle  # noqa: E402
from temporalio.common import SearchAttributePair, TypedSearchAttributes  # noqa: E402
from temporalio.worker import PollerBehaviorSimpleMaximum, Worker  # noqa: E402

from backfill.batches import search_attributes as sa
from backfill.files import FileStore  # noqa: E402
from backfill.platform.config import Limits, ModelConfig, RouteConfig, Settings  # noqa: E402
from backfill.platform.ids import new_batch_id, scheduler_workflow_id  # noqa: E402
from bench.ablate import ABLATIONS, ablated  # noqa: E402
from bench.bare_workflow import BareInput, BareWorkflow, noop, wait_like_upstream  # noqa: E402
from bench.common import (  # noqa: E402
    CpuMeter,
    CpuSpan,
    analyze_chain,
    await_result,
    clear_settings_env,
    dev_server,
    first_run_id,
    log,
)
from bench.line_work import LineWork  # noqa: E402
from tools.dev.devserver import connect_client  # noqa: E402
from tools.dev.procs import Child, backfill_argv, free_port, wait_for_port  # noqa: E402
from tools.dev.runner import EMBEDDED_DYNAMIC_CONFIG  # noqa: E402
from tools.sim import SimConfig, SimServer  # noqa: E402
from worker.lag import measuring  # noqa: E402
from worker.main import ACTIVITY_POLLERS, eager_options, running_worker  # noqa: E402
from worker.upstream import upstream_client  # noqa: E402
from workflows.batch import BatchInput, BatchWorkflow  # noqa: E402
from workflows.line_activity import LINE_HEARTBEAT_SECONDS  # noqa: E402
from workflows.patches import LINES_PER_RUN  # noqa: E402

MODEL = "bench"
EAGER_DEFAULT: int = Settings.model_fields["worker_eager_activities"].default
ACTIVITY_WORKER = Path(__file__).resolve().parent / "activity_worker.py"
WORKSPACE = "bench"


def jsonl(n: int) -> bytes:
    out = []
    for i in range(n):
        line = {
            "custom_id": f"req-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": MODEL, "messages": [{"role": "user", "content": f"hello {i}"}]},
        }
        out.append(json.dumps(line, separators=(",", ":")))
    return ("\n".join(out) + "\n").encode()


# ---- the simulator (in this process, or its own) -------------------------------------------------
class Sim:
    def __init__(self, latency_ms: float, tmp: Path, subprocess: bool) -> None:
        self.config = SimConfig(model_names=[], latency_ms=latency_ms, max_num_seqs=1024)
        self.subprocess = subprocess
        self.tmp = tmp
        self._server: SimServer | None = None
        self._child: Child | None = None
        self.base_url = ""

    @property
    def pid(self) -> int | None:
        return self._child.pid if self._child else None

    async def start(self) -> None:
        if not self.subprocess:
            self._server = SimServer(self.config)
            await self._server.start()
            self.base_url = self._server.base_url
            return
        port = free_port()
        self._child = Child("sim")
        argv = backfill_argv(
            "sim",
            "--port",
            str(port),
            "--any-model",
            "--max-num-seqs",
            str(self.config.max_num_seqs),
            "--latency-ms",
            str(self.config.latency_ms),
            "--log-level",
            "warning",
        )
        self._child.start(argv, log_path=self.tmp / "sim.log")
        if not await asyncio.to_thread(wait_for_port, port, "127.0.0.1", 30.0):
            raise RuntimeError(f"simulator did not listen: {self._child.log_tail()}")
        self.base_url = f"http://127.0.0.1:{port}/v1"

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop()
        if self._child is not None:
            await asyncio.to_thread(self._child.stop, 5.0)


# ---- phase 1: backfill ---------------------------------------------------------------------------
async def run_backfill(
    client: Client,
    tmp: Path,
    sim: Sim,
    meter: CpuMeter,
    *,
    lines: int,
    cap: int,
    deadline_s: float,
    dump_dir: Path | None = None,
    ablations: list[str] | None = None,
    split_worker: bool = False,
    worker_processes: int = 0,
    eager: int = EAGER_DEFAULT,
) -> dict[str, Any]:
    suffix = secrets.token_hex(4)
    route_id = f"sim-{suffix}"
    workers_report: dict[str, Any] = {}
    settings = Settings(
        data_dir=tmp / "data",
        temporal_address=client.service_client.config.target_host,
        temporal_namespace=client.namespace,
        task_queue=f"bench-backfill-{suffix}",
        worker_max_concurrent_activities=max(512, 2 * cap),
        worker_eager_activities=eager,
        limits=Limits(max_lines_per_batch=max(50_000, lines)),
        models=[
            ModelConfig(
                id=MODEL,
                routes=[RouteConfig(id=route_id, base_url=sim.base_url, max_concurrent_lines=cap)],
            )
        ],
    )
    store = FileStore(settings.data_dir)
    t_up = time.monotonic()
    up = store.begin_upload(settings.limits.max_file_bytes)
    up.write(jsonl(lines))
    file = up.finish(workspace=WORKSPACE, filename="bench.jsonl", purpose="batch")
    upload_s = time.monotonic() - t_up

    now = int(time.time())
    batch_id = new_batch_id()
    inp = BatchInput(
        batch_id=batch_id,
        workspace=WORKSPACE,
        input_file_id=file.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        created_at=now,
        line_timeout_seconds=settings.limits.line_timeout_seconds,
        max_line_retries=settings.limits.max_line_retries,
    )
    what = f" (ablated: {','.join(ablations)})" if ablations else ""
    log(f"backfill{what}: {lines} lines, cap {cap}, batch {batch_id}, route {route_id}")
    latency_s = sim.config.latency_ms / 1000.0
    with ablated([] if split_worker else ablations or [], latency_s):
        async with (
            backfill_worker(
                client,
                settings,
                tmp,
                meter,
                split=split_worker,
                processes=worker_processes,
                report=workers_report,
                ablations=ablations if split_worker else None,
                latency_s=latency_s,
            ),
            measuring() as lag,
        ):
            with meter.span() as span:
                handle: WorkflowHandle[Any, Any] = await client.start_workflow(
                    BatchWorkflow.run,
                    inp,
                    id=batch_id,
                    task_queue=settings.task_queue,
                    search_attributes=TypedSearchAttributes(
                        [
                            SearchAttributePair(sa.WORKSPACE, WORKSPACE),
                            SearchAttributePair(sa.STATUS, "validating"),
                            SearchAttributePair(sa.ENDPOINT, "/v1/chat/completions"),
                            SearchAttributePair(sa.CREATED_AT, now),
                        ]
                    ),
                    memo={"workspace": WORKSPACE},
                    execution_timeout=timedelta(seconds=deadline_s + 60),
                )
                batch = await await_result(client, handle, deadline_s)
            loop_lag = lag.take()
            log(f"backfill: {batch.status} in {span.wall_s:.2f}s; reading histories")
    counts = batch.request_counts
    if batch.status != "completed" or counts.completed + counts.failed != lines:
        raise RuntimeError(
            f"backfill batch ended {batch.status} with {counts.model_dump()} (expected "
            f"{lines} finished)"
        )
    hist = await analyze_chain(
        client, batch_id, handle.first_execution_run_id, "run_line", dump_dir
    )
    in_worker = _mean_line_seconds(route_id)
    sched_id = scheduler_workflow_id(route_id)
    sched_first = await first_run_id(client, sched_id)
    sched = await analyze_chain(client, sched_id, sched_first, "find_closed_batches", dump_dir)
    return {
        "ablations": ablations or [],
        "split_worker": split_worker,
        "worker_processes": worker_processes,
        "workers": workers_report.get("workers"),
        "batch_id": batch_id,
        "status": batch.status,
        "request_counts": counts.model_dump(),
        "upload_s": round(upload_s, 3),
        "cpu": _cpu(span),
        "lines_per_s": round(lines / span.wall_s, 1),
        "line_mean_in_run_line_ms": None if in_worker is None else round(1000 * in_worker, 1),
        "loop_lag": loop_lag,
        "history": hist.summary("run_line"),
        "scheduler": {
            "workflow_id": sched_id,
            "runs": len(sched.runs),
            "events": sched.total_events,
            "event_types": dict(sched.event_types.most_common()),
        },
    }


def _mean_line_seconds(route_id: str) -> float | None:
    """Mean time inside `run_line` (activity start to committed result, as the worker's
    `gateway_batch_line_seconds` saw it) of this process's lines; None when they ran elsewhere."""
    from prometheus_client import REGISTRY

    labels = {"provider": route_id}
    total = REGISTRY.get_sample_value("gateway_batch_line_seconds_sum", labels)
    count = REGISTRY.get_sample_value("gateway_batch_line_seconds_count", labels)
    return total / count if total is not None and count else None


@contextlib.asynccontextmanager
async def backfill_worker(
    client: Client,
    settings: Settings,
    tmp: Path,
    meter: CpuMeter,
    *,
    split: bool,
    processes: int = 0,
    report: dict[str, Any] | None = None,
    ablations: list[str] | None = None,
    latency_s: float = 0.0,
) -> AsyncIterator[None]:
    """The real worker in-process (`running_worker`); with `split`, a workflows-only worker
    here and an activities-only one in its own process (`BACKFILL_WORKER_ROLE`); with
    `processes` N > 0, N real workers, each its own process (bench/activity_worker.py), their
    loop lags and CPU put in `report`."""
    if processes > 0:
        async with worker_processes(settings, tmp, processes, report):
            yield
        return
    if not split:
        async with running_worker(client, settings):
            yield
        return
    settings_path = tmp / f"settings-{settings.task_queue}.json"
    ready = tmp / f"ready-{settings.task_queue}"
    settings_path.write_text(settings.model_dump_json())
    argv = [sys.executable, str(ACTIVITY_WORKER), str(settings_path), str(ready)]
    argv += ["--role", "activities"]
    if ablations:  # the lines run in the child: the ablations are applied there
        argv += ["--ablate", ",".join(ablations), "--latency-s", str(latency_s)]
    child = Child("activity-worker")
    child.start(argv, log_path=tmp / "activity-worker.log")
    try:
        for _ in range(600):  # ≤ 60 s
            if ready.exists():
                break
            if not child.running:
                raise RuntimeError(f"activity worker exited: {child.log_tail()}")
            await asyncio.sleep(0.1)
        else:
            raise RuntimeError(f"activity worker not ready: {child.log_tail()}")
        meter.activity_worker_pid = child.pid
        async with running_worker(client, settings.model_copy(update={"worker_role": "workflows"})):
            yield
    finally:
        meter.activity_worker_pid = None
        await asyncio.to_thread(child.stop, 10.0)


@contextlib.asynccontextmanager
async def worker_processes(
    settings: Settings, tmp: Path, n: int, report: dict[str, Any] | None
) -> AsyncIterator[None]:
    """N whole backfill workers (`running_worker`), each its own process, as an operator runs
    them; on exit each one's event-loop lag and CPU seconds go into `report["workers"]`."""
    from bench.common import proc_cpu_seconds

    settings_path = tmp / f"settings-{settings.task_queue}.json"
    settings_path.write_text(settings.model_dump_json())
    children: list[tuple[Child, Path, Path]] = []
    try:
        for i in range(n):
            ready = tmp / f"ready-{settings.task_queue}-{i}"
            lag_out = tmp / f"lag-{settings.task_queue}-{i}.json"
            child = Child(f"worker{i}")
            argv = [sys.executable, str(ACTIVITY_WORKER), str(settings_path), str(ready)]
            argv += ["--lag-out", str(lag_out)]
            child.start(argv, log_path=tmp / f"worker{i}-{settings.task_queue}.log")
            children.append((child, ready, lag_out))
        for child, ready, _ in children:
            for _ in range(600):  # ≤ 60 s
                if ready.exists():
                    break
                if not child.running:
                    raise RuntimeError(f"{child.name} exited: {child.log_tail()}")
                await asyncio.sleep(0.1)
            else:
                raise RuntimeError(f"{child.name} not ready: {child.log_tail()}")
        yield
    finally:
        cpu = [proc_cpu_seconds(c.pid) for c, _, _ in children]
        for child, _, _ in children:
            await asyncio.to_thread(child.stop, 10.0)
        if report is not None:
            report["workers"] = [
                {
                    "cpu_s": round(c, 2),
                    "loop_lag": json.loads(lag.read_text()) if lag.exists() else None,
                }
                for c, (_, _, lag) in zip(cpu, children, strict=True)
            ]


# ---- phase 2: bare Temporal ----------------------------------------------------------------------
async def run_bare(
    client: Client,
    meter: CpuMeter,
    *,
    total: int,
    window: int,
    per_run: int,
    max_concurrent_activities: int,
    deadline_s: float,
    label: str = "bare",
    dump_dir: Path | None = None,
    activity_pollers: int | None = None,
    latency_s: float = 0.0,
    eager: int = EAGER_DEFAULT,
    work: LineWork | None = None,
) -> dict[str, Any]:
    suffix = secrets.token_hex(4)
    task_queue = f"bench-bare-{suffix}"
    wf_id = f"bench-bare-{suffix}"
    kind = f"activities waiting {latency_s:g} s" if latency_s > 0 else "trivial activities"
    if work is not None:
        kind = "activities doing a line's work (read, POST, durable write)"
    log(f"{label}: {total} {kind}, window {window}")
    worker = Worker(
        client,
        task_queue=task_queue,
        workflows=[BareWorkflow],
        activities=[noop, wait_like_upstream] + ([work.line_work] if work else []),
        max_concurrent_activities=max_concurrent_activities,
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=2),
        **eager_options(eager),
        activity_task_poller_behavior=(
            PollerBehaviorSimpleMaximum(activity_pollers) if activity_pollers else ACTIVITY_POLLERS
        ),
    )
    async with worker, measuring() as lag:
        with meter.span() as span:
            handle = await client.start_workflow(
                BareWorkflow.run,
                BareInput(
                    total=total,
                    window=window,
                    per_run=per_run,
                    latency_s=latency_s,
                    work=work is not None,
                    # scheduled like a line: a heartbeat timeout is what lets a dead worker's
                    # lines run again within seconds (issue 14), whoever dispatches them
                    heartbeat_s=LINE_HEARTBEAT_SECONDS if work is not None else None,
                ),
                id=wf_id,
                task_queue=task_queue,
                execution_timeout=timedelta(seconds=deadline_s + 60),
            )
            result = await await_result(client, handle, deadline_s)
        loop_lag = lag.take()
    if result.done != total:
        raise RuntimeError(f"{label}: {result.done} activities done, expected {total}")
    log(f"{label}: done in {span.wall_s:.2f}s")
    name = "wait_like_upstream" if latency_s > 0 else "noop"
    if work is not None:
        name = "line_work"
    hist = await analyze_chain(client, wf_id, handle.first_execution_run_id, name, dump_dir)
    return {
        "workflow_id": wf_id,
        "latency_s": latency_s,
        "loop_lag": loop_lag,
        "cpu": _cpu(span),
        "activities_per_s": round(total / span.wall_s, 1),
        "history": hist.summary(name),
    }


async def run_bare_work(
    client: Client,
    meter: CpuMeter,
    tmp: Path,
    sim: Sim,
    *,
    total: int,
    window: int,
    max_concurrent_activities: int,
    deadline_s: float,
    dump_dir: Path | None,
    eager: int,
) -> dict[str, Any]:
    """The bare baseline whose activities do a line's own work (`LineWork`) on the same
    simulator, HTTP client and disk as backfill's lines."""
    d = tmp / f"bare-work-{secrets.token_hex(4)}"
    d.mkdir()
    (d / "input.jsonl").write_bytes(jsonl(total))
    async with upstream_client() as http:
        work = LineWork(
            d / "input.jsonl", sim.base_url + "/chat/completions", http, FileStore(d / "store")
        )
        try:
            return await run_bare(
                client,
                meter,
                total=total,
                window=window,
                per_run=LINES_PER_RUN,
                max_concurrent_activities=max_concurrent_activities,
                deadline_s=deadline_s,
                label="bare-work",
                dump_dir=dump_dir,
                eager=eager,
                work=work,
            )
        finally:
            work.close()


def _cpu(span: CpuSpan) -> dict[str, float]:
    w = span.wall_s or 1.0
    return {
        "wall_s": round(span.wall_s, 3),
        "bench_process_cpu_s": round(span.bench_cpu_s, 2),
        "server_cpu_s": round(span.server_cpu_s, 2),
        "sim_process_cpu_s": round(span.sim_cpu_s, 2),
        "activity_worker_cpu_s": round(span.activity_worker_cpu_s, 2),
        "bench_process_cores": round(span.bench_cpu_s / w, 2),
        "server_cores": round(span.server_cpu_s / w, 2),
        "bench_threads_cpu_s": span.threads_cpu_s,
    }


# ---- component probes (where could the time go?) -------------------------------------------------
async def probe_store(tmp: Path, n: int) -> dict[str, Any]:
    """FileStore.commit_result (write + fsync + link), sequential, as run_line calls it."""
    store = FileStore(tmp / "probe-store")
    batch_id = new_batch_id()
    record = b'{"id":"batch_req_x","custom_id":"req-0","response":{"status_code":200},"error":null}'
    t0 = time.perf_counter()
    for i in range(n):
        store.commit_result(batch_id, i, record)
    dt = time.perf_counter() - t0
    return {"commits": n, "mean_ms": round(1000 * dt / n, 3), "per_s": round(n / dt, 1)}


async def probe_http(base_url: str, n: int, concurrency: int) -> dict[str, Any]:
    """n chat completions at `concurrency` with the worker's httpx settings (no Temporal)."""
    import httpx

    from worker.main import upstream_client

    url = base_url.rstrip("/") + "/chat/completions"
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).encode()
    sem = asyncio.Semaphore(concurrency)
    async with upstream_client() as http:
        errors: list[str] = []

        async def one() -> None:
            async with sem:
                try:
                    async with http.stream(
                        "POST",
                        url,
                        content=body,
                        headers={"Content-Type": "application/json"},
                        timeout=httpx.Timeout(60.0, connect=10.0),  # the worker's connect timeout
                    ) as resp:
                        async for _ in resp.aiter_bytes():
                            pass
                        resp.raise_for_status()
                except httpx.HTTPError as err:
                    errors.append(type(err).__name__)

        t0 = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*(one() for _ in range(n))), 300)
        dt = time.perf_counter() - t0
    return {
        "requests": n,
        "concurrency": concurrency,
        "per_s": round(n / dt, 1),
        "errors": dict(Counter(errors)),
    }


async def _probe(coro: Any) -> dict[str, Any]:
    """A probe's numbers, or its error: a probe never costs the phases' results."""
    try:
        return dict(await coro)
    except Exception as err:
        log(f"probe failed: {type(err).__name__}: {err}")
        return {"error": f"{type(err).__name__}: {err}"[:300]}


# ---- main ----------------------------------------------------------------------------------------
async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    dropped = clear_settings_env()
    if dropped:
        log(f"ignoring environment for this bench: {', '.join(sorted(dropped))}")
    result: dict[str, Any] = {
        "lines": args.lines,
        "cap": args.cap,
        "latency_ms": args.latency_ms,
        "lines_per_run": LINES_PER_RUN,
        "dynamic_config": args.dynamic_config,
        "sim_subprocess": args.sim_subprocess,
        "split_worker": args.split_worker,
        "worker_processes": args.worker_processes,
        "db": "memory" if args.in_memory else "sqlite-file",
        "repeat": args.repeat,
        "eager": args.eager,
        "bare_activity_pollers": args.bare_activity_pollers,
        "cpus": os.cpu_count(),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
    }
    with tempfile.TemporaryDirectory(prefix="backfill-bench-") as tmp_s:
        tmp = Path(tmp_s)
        t0 = time.monotonic()
        async with dev_server(
            tmp, dynamic_config=args.dynamic_config, in_memory=args.in_memory
        ) as server:
            result["server_start_s"] = round(time.monotonic() - t0, 2)
            log(f"dev server {server.address} (pid {server.pid}) ready")
            client = await connect_client(server.address, server.namespace)
            sim = Sim(args.latency_ms, tmp, args.sim_subprocess)
            await sim.start()
            try:
                meter = CpuMeter(server.pid, sim.pid)
                slots = max(512, 2 * args.cap)

                async def run_phase(phase: str, n: int, warmup: bool = False) -> dict[str, Any]:
                    dump = None if warmup else args.dump_histories
                    if phase == "backfill":
                        return await run_backfill(
                            client,
                            tmp,
                            sim,
                            meter,
                            lines=n,
                            cap=args.cap,
                            deadline_s=args.timeout,
                            dump_dir=dump,
                            split_worker=args.split_worker,
                            worker_processes=args.worker_processes,
                            eager=args.eager,
                        )
                    if phase == "bare-work":
                        return await run_bare_work(
                            client,
                            meter,
                            tmp,
                            sim,
                            total=n,
                            window=args.cap,
                            max_concurrent_activities=slots,
                            deadline_s=args.timeout,
                            dump_dir=dump,
                            eager=args.eager,
                        )
                    return await run_bare(
                        client,
                        meter,
                        total=n,
                        window=args.cap,
                        per_run=LINES_PER_RUN,
                        max_concurrent_activities=slots,
                        deadline_s=args.timeout,
                        dump_dir=dump,
                        activity_pollers=args.bare_activity_pollers,
                        latency_s=args.latency_ms / 1000.0,
                        eager=args.eager,
                    )

                if args.warmup > 0:
                    warm = await run_bare(
                        client,
                        meter,
                        total=args.warmup,
                        window=args.cap,
                        per_run=LINES_PER_RUN,
                        max_concurrent_activities=slots,
                        deadline_s=args.timeout,
                        label="warmup",
                    )
                    result["warmup"] = {"activities": args.warmup, "cpu": warm["cpu"]}
                    # Each timed phase's own code warmed too (imports, the workflows' sandbox,
                    # first connections), so the first phase is not the only one paying them.
                    for phase in ("backfill", "bare-work"):
                        if phase in args.phases:
                            await run_phase(phase, args.warmup, warmup=True)
                runs: dict[str, list[dict[str, Any]]] = {
                    "backfill": [],
                    "bare": [],
                    "bare-work": [],
                }
                for rep in range(args.repeat):
                    for phase in args.phases:
                        if args.repeat > 1:
                            log(f"repetition {rep + 1}/{args.repeat}: {phase}")
                        runs[phase].append(await run_phase(phase, args.lines))
                for variant in args.ablate:
                    out = await run_backfill(
                        client,
                        tmp,
                        sim,
                        meter,
                        lines=args.lines,
                        cap=args.cap,
                        deadline_s=args.timeout,
                        dump_dir=args.dump_histories,
                        ablations=variant,
                        split_worker=args.split_worker,
                        eager=args.eager,
                    )
                    result.setdefault("ablated", []).append(out)
                for phase, key in (
                    ("backfill", "lines_per_s"),
                    ("bare", "activities_per_s"),
                    ("bare-work", "activities_per_s"),
                ):
                    if runs[phase]:
                        result[phase] = _median(runs[phase], key)
                        result[phase]["all_" + key] = [x[key] for x in runs[phase]]
                if args.probes:
                    log("probes: FileStore commit and httpx against the simulator")
                    result["probes"] = {
                        "store_commit": await _probe(probe_store(tmp, 300)),
                        "http": await _probe(
                            probe_http(sim.base_url, min(args.lines, 2000), args.cap)
                        ),
                    }
            finally:
                await sim.stop()
    result["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    if "backfill" in result and "bare" in result:
        result["ratio"] = round(
            result["backfill"]["lines_per_s"] / result["bare"]["activities_per_s"], 3
        )
    if "backfill" in result and "bare-work" in result:
        result["ratio_work"] = round(
            result["backfill"]["lines_per_s"] / result["bare-work"]["activities_per_s"], 3
        )
    return result


def _median(outs: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The repetition with the median rate (the lower middle one for an even count)."""
    ordered = sorted(outs, key=lambda x: float(x[key]))
    return dict(ordered[(len(ordered) - 1) // 2])


def table(r: dict[str, Any]) -> str:
    rows: list[tuple[str, str]] = [
        ("lines", str(r["lines"])),
        ("cap (max_concurrent_lines / window)", str(r["cap"])),
        ("simulator latency_ms", f"{r['latency_ms']:g}"),
    ]
    b, bare = r.get("backfill"), r.get("bare")
    if b:
        h = b["history"]
        rows += [
            ("backfill lines/s", f"{b['lines_per_s']:.1f}"),
            ("backfill wall s (start → result)", f"{b['cpu']['wall_s']:.2f}"),
            ("backfill failed lines", str(b["request_counts"].get("failed", 0))),
        ]
    if bare:
        rows += [
            ("bare activities/s", f"{bare['activities_per_s']:.1f}"),
            ("bare wall s", f"{bare['cpu']['wall_s']:.2f}"),
        ]
    if "ratio" in r:
        rows.append(("ratio backfill / bare", f"{r['ratio']:.2f}"))
    bw = r.get("bare-work")
    if bw:
        rows += [
            ("bare-work lines/s (read, POST, durable write)", f"{bw['activities_per_s']:.1f}"),
            ("bare-work CPU ms per line, bench process", _per_line(bw["cpu"], r["lines"])),
            (
                "bare-work workflow tasks (per line)",
                f"{bw['history']['workflow_tasks']} ({bw['history']['workflow_tasks_per_line']})",
            ),
            (
                "bare-work CPU ms per line: bench process / server / simulator",
                " / ".join(
                    f"{1000 * bw['cpu'][k] / r['lines']:.2f}"
                    for k in ("bench_process_cpu_s", "server_cpu_s", "sim_process_cpu_s")
                ),
            ),
        ]
    if b:
        rows.append(
            (
                "backfill CPU ms per line: bench process / server / simulator",
                " / ".join(
                    f"{1000 * b['cpu'][k] / r['lines']:.2f}"
                    for k in ("bench_process_cpu_s", "server_cpu_s", "sim_process_cpu_s")
                ),
            )
        )
    if "ratio_work" in r:
        rows.append(("ratio backfill / bare-work", f"{r['ratio_work']:.2f}"))
    if b:
        h = b["history"]
        rows += [
            ("batch history events (all runs)", f"{h['events']} in {h['runs']} runs"),
            ("batch events per line", f"{h['events_per_line']}"),
            (
                "scheduler history events",
                f"{b['scheduler']['events']} in {b['scheduler']['runs']} run(s)",
            ),
            ("batch mean lines in flight", f"{h['line_mean_in_flight']}"),
            (
                "batch line schedule→start / start→close ms",
                f"{h['line_mean_schedule_to_start_ms']} / {h['line_mean_start_to_close_ms']}",
            ),
            (
                "batch workflow task timeouts (s waited)",
                f"{h['wft_timeouts']} ({h['wft_timeout_waits_s']})",
            ),
            (
                "in-process worker loop lag p50 / p99 / max ms (backfill)",
                f"{b['loop_lag']['p50_ms']} / {b['loop_lag']['p99_ms']} / "
                f"{b['loop_lag']['max_ms']}",
            ),
            *[
                (
                    f"worker process {i} loop lag p50 / p99 ms, CPU s",
                    f"{w['loop_lag']['p50_ms']} / {w['loop_lag']['p99_ms']}, {w['cpu_s']}"
                    if w["loop_lag"]
                    else f"-, {w['cpu_s']}",
                )
                for i, w in enumerate(b.get("workers") or [])
            ],
            (
                "batch workflow task schedule→start / start→close mean ms",
                f"{h['wft_mean_schedule_to_start_ms']} / {h['wft_mean_start_to_close_ms']}",
            ),
            (
                "batch workflow tasks (per line)",
                f"{h['workflow_tasks']} ({h['workflow_tasks_per_line']})",
            ),
            (
                "batch continue-as-new idle / drain tail s",
                f"{h['continue_as_new_idle_s']} / {h['continue_as_new_drain_tail_s']}",
            ),
            (
                "batch validate / finalize s",
                " / ".join(
                    str(h["other_activities"].get(n, {}).get("total_schedule_to_close_s", "-"))
                    for n in ("validate_input", "finalize_batch")
                ),
            ),
            (
                "backfill CPU s: bench process / server",
                f"{b['cpu']['bench_process_cpu_s']} / {b['cpu']['server_cpu_s']}",
            ),
            ("backfill CPU ms per line, bench process", _per_line(b["cpu"], r["lines"])),
        ]
    if bare:
        h = bare["history"]
        rows += [
            ("bare history events (all runs)", f"{h['events']} in {h['runs']} runs"),
            ("bare mean activities in flight", f"{h['line_mean_in_flight']}"),
            (
                "bare schedule→start / start→close ms",
                f"{h['line_mean_schedule_to_start_ms']} / {h['line_mean_start_to_close_ms']}",
            ),
            (
                "bare workflow task timeouts (s waited)",
                f"{h['wft_timeouts']} ({h['wft_timeout_waits_s']})",
            ),
            (
                "worker event-loop lag p50 / p99 / max ms (bare)",
                f"{bare['loop_lag']['p50_ms']} / {bare['loop_lag']['p99_ms']} / "
                f"{bare['loop_lag']['max_ms']}",
            ),
            (
                "bare workflow task schedule→start / start→close mean ms",
                f"{h['wft_mean_schedule_to_start_ms']} / {h['wft_mean_start_to_close_ms']}",
            ),
            (
                "bare workflow tasks (per activity)",
                f"{h['workflow_tasks']} ({h['workflow_tasks_per_line']})",
            ),
            (
                "bare continue-as-new idle / drain tail s",
                f"{h['continue_as_new_idle_s']} / {h['continue_as_new_drain_tail_s']}",
            ),
            (
                "bare CPU s: bench process / server",
                f"{bare['cpu']['bench_process_cpu_s']} / {bare['cpu']['server_cpu_s']}",
            ),
            ("bare CPU ms per activity, bench process", _per_line(bare["cpu"], r["lines"])),
        ]
    for a in r.get("ablated", []):
        h = a["history"]
        rows.append(
            (
                f"what-if backfill without {'+'.join(a['ablations'])}",
                f"{a['lines_per_s']:.1f} lines/s (CPU bench/server "
                f"{a['cpu']['bench_process_cpu_s']}/{a['cpu']['server_cpu_s']} s)",
            )
        )
    if "probes" in r:
        p = r["probes"]
        rows += [
            (
                "probe: store.commit_result ms (fsync)",
                str(p["store_commit"].get("mean_ms", p["store_commit"].get("error"))),
            ),
            (
                "probe: httpx→sim req/s at cap",
                str(p["http"].get("per_s", p["http"].get("error"))),
            ),
        ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _per_line(cpu: dict[str, Any], n: int) -> str:
    """CPU ms per line of the bench process, then by thread group (thread_cpu_seconds)."""
    total = f"{1000 * cpu['bench_process_cpu_s'] / n:.2f}"
    groups = cpu.get("bench_threads_cpu_s") or {}
    parts = ", ".join(f"{k} {1000 * v / n:.2f}" for k, v in groups.items())
    return f"{total} ({parts})" if parts else total


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--lines", type=int, default=3000, help="lines in the batch (and activities)")
    p.add_argument("--cap", type=int, default=256, help="route max_concurrent_lines (1-256)")
    p.add_argument("--latency-ms", type=float, default=0.0, help="simulator latency per request")
    p.add_argument(
        "--dynamic-config",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="passed to the dev server as --dynamic-config-value (repeatable), after make run's "
        "own (tools.dev.runner.EMBEDDED_DYNAMIC_CONFIG)",
    )
    p.add_argument(
        "--server-defaults",
        action="store_true",
        help="the dev server without make run's dynamic config (Temporal's defaults)",
    )
    p.add_argument(
        "--phases",
        default="backfill,bare,bare-work",
        help="comma-separated phases, run in the order given (default backfill,bare,bare-work; "
        "bare-work: bare activities doing a line's read, POST and durable write)",
    )
    p.add_argument("--warmup", type=int, default=200, help="trivial activities run first, untimed")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds allowed per phase")
    p.add_argument(
        "--sim-subprocess",
        action="store_true",
        help="run the simulator as its own process instead of in this event loop",
    )
    p.add_argument("--in-memory", action="store_true", help="dev server without a SQLite file")
    p.add_argument("--no-probes", dest="probes", action="store_false", help="skip the probes")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument(
        "--split-worker",
        action="store_true",
        help="backfill phase: a workflows-only worker in this process and an activities-only one "
        "in its own (BACKFILL_WORKER_ROLE)",
    )
    p.add_argument(
        "--worker-processes",
        type=int,
        default=0,
        metavar="N",
        help="backfill phase: N real workers, each its own process (default 0: one worker in "
        "this process); each reports its event-loop lag",
    )
    p.add_argument(
        "--ablate",
        action="append",
        default=[],
        metavar="WHAT[,WHAT]",
        help=f"what-if: after the phases, run the backfill phase again without these per-line "
        f"costs (of {', '.join(ABLATIONS)}; monkeypatched in the process that runs the "
        "lines; repeatable)",
    )
    p.add_argument(
        "--bare-activity-pollers",
        type=int,
        default=None,
        metavar="N",
        help="exploration: N fixed concurrent activity polls for the bare worker (5 is the "
        "SDK's default); by default it polls like backfill's worker (worker.main.ACTIVITY_POLLERS)",
    )
    p.add_argument(
        "--eager",
        type=int,
        default=EAGER_DEFAULT,
        metavar="N",
        help=f"both phases: activities a worker may take eagerly per workflow task (0: none; "
        f"default {EAGER_DEFAULT}, backfill's BACKFILL_WORKER_EAGER_ACTIVITIES; the SDK's is 3)",
    )
    p.add_argument(
        "--repeat", type=int, default=1, help="run the phases this many times; report medians"
    )
    p.add_argument(
        "--dump-histories",
        type=Path,
        default=None,
        metavar="DIR",
        help="write every workflow history read (JSON) into DIR",
    )
    args = p.parse_args(argv)
    if not 1 <= args.cap <= 256:
        p.error("--cap must be between 1 and 256 (the route's max_concurrent_lines)")
    if args.lines < 1:
        p.error("--lines must be at least 1")
    if not 1 <= args.repeat <= 20:
        p.error("--repeat must be between 1 and 20")
    embedded = [f"{k}={json.dumps(v)}" for k, v in EMBEDDED_DYNAMIC_CONFIG.items()]
    args.dynamic_config = ([] if args.server_defaults else embedded) + args.dynamic_config
    args.ablate = [[x.strip() for x in v.split(",") if x.strip()] for v in args.ablate]
    for v in args.ablate:
        if not v or not set(v) <= set(ABLATIONS):
            p.error(f"--ablate takes a comma-separated subset of {', '.join(ABLATIONS)}")
    if args.worker_processes and (args.split_worker or args.ablate):
        p.error("--worker-processes cannot be combined with --split-worker or --ablate")
    args.phases = [x.strip() for x in args.phases.split(",") if x.strip()]
    if not set(args.phases) <= {"backfill", "bare", "bare-work"} or not args.phases:
        p.error("--phases takes backfill, bare and/or bare-work")
    return args


async def _guarded(coro: Any) -> Any:
    """Run coro; SIGTERM/SIGHUP cancel it, so the dev server and simulator are still stopped."""
    import signal

    task = asyncio.ensure_future(coro)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, task.cancel)
    return await task


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # The SDK core logs (e.g. WARN lines) to file descriptor 1: point fd 1 at stderr and keep a
    # private copy of the real stdout for the result, so --json output stays parseable.
    sys.stdout.flush()
    result_out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    import logging

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    try:
        result = asyncio.run(_guarded(main_async(args)))
    except (asyncio.CancelledError, KeyboardInterrupt):
        log("interrupted: servers stopped, nothing measured")
        return 130
    with result_out:
        if args.json:
            print(json.dumps(result, indent=2), file=result_out)
        else:
            print(table(result), file=result_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
