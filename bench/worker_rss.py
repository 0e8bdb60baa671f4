"""Peak memory of a real backfill worker with many large upstream answers in flight.

    .venv/bin/python bench/worker_rss.py --lines 512 --cap 256 --reply-bytes 1048576

One private dev server; the simulator in this process answering every chat line with a
completion of `--reply-bytes` bytes after `--latency-ms`; one route whose
`max_concurrent_lines` is `--cap`; the real worker (`running_worker`, workflows and activities)
as its own process (bench/activity_worker.py --workflows). A batch of `--lines` lines runs to
the end while this process samples the worker's resident set (`/proc/PID/status` VmRSS every
0.1 s) and the simulator's requests in flight; at the end it reads the kernel's high-water mark
(VmHWM). Printed as JSON on stdout: idle RSS, peak RSS, (peak - idle) per line in flight, and
the most requests in flight seen at the upstream. The peak varies from run to run by ±15% (how
many answers arrive together): compare medians of a few runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import secrets
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench.*` from a plain run

from temporalio.client import Client  # noqa: E402
from temporalio.common import SearchAttributePair, TypedSearchAttributes  # noqa: E402

from backfill.batches import search_attributes as sa
from backfill.files import FileStore  # noqa: E402
from backfill.platform.config import Limits, ModelConfig, RouteConfig, Settings  # noqa: E402
from backfill.platform.ids import new_batch_id  # noqa: E402
from bench.common import await_result, clear_settings_env, dev_server, log  # noqa: E402
from tools.dev.devserver import connect_client  # noqa: E402
from tools.dev.procs import Child  # noqa: E402
from tools.sim import SimConfig, SimServer  # noqa: E402
from workflows.batch import BatchInput, BatchWorkflow  # noqa: E402

WORKER = Path(__file__).resolve().parent / "activity_worker.py"
MODEL = "bench"
WORKSPACE = "bench"
MB = 1024 * 1024


def status_kb(pid: int, field: str) -> int:
    """A `kB` field of /proc/PID/status (VmRSS, VmHWM), 0 once the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    except OSError:
        return 0
    return 0


def jsonl(n: int) -> bytes:
    return b"".join(
        json.dumps(
            {
                "custom_id": f"r{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": MODEL, "messages": [{"role": "user", "content": f"hi {i}"}]},
            }
        ).encode()
        + b"\n"
        for i in range(n)
    )


@contextlib.asynccontextmanager
async def worker_process(settings: Settings, tmp: Path) -> AsyncIterator[Child]:
    """The real worker as its own process, ready (polling) when yielded; always stopped."""
    settings_path, ready = tmp / "settings.json", tmp / "ready"
    settings_path.write_text(settings.model_dump_json())
    child = Child("worker")
    child.start(
        [sys.executable, str(WORKER), str(settings_path), str(ready), "--workflows"],
        log_path=tmp / "worker.log",
    )
    try:
        for _ in range(600):  # ≤ 60 s
            if ready.exists():
                break
            if not child.running:
                raise RuntimeError(f"worker exited: {child.log_tail()}")
            await asyncio.sleep(0.1)
        else:
            raise RuntimeError(f"worker not ready: {child.log_tail()}")
        yield child
    finally:
        await asyncio.to_thread(child.stop, 10.0)


async def run(client: Client, tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    sim = SimServer(
        SimConfig(
            model_names=[],
            latency_ms=args.latency_ms,
            max_num_seqs=4096,
            reply_bytes=args.reply_bytes,
        )
    )
    await sim.start()
    try:
        suffix = secrets.token_hex(4)
        settings = Settings(
            data_dir=tmp / "data",
            temporal_address=client.service_client.config.target_host,
            temporal_namespace=client.namespace,
            task_queue=f"bench-rss-{suffix}",
            worker_max_concurrent_activities=max(512, 2 * args.cap),
            limits=Limits(
                max_lines_per_batch=max(50_000, args.lines),
                max_response_bytes=max(8 * MB, 2 * args.reply_bytes),
            ),
            models=[
                ModelConfig(
                    id=MODEL,
                    routes=[
                        RouteConfig(
                            id=f"sim-{suffix}", base_url=sim.base_url, max_concurrent_lines=args.cap
                        )
                    ],
                )
            ],
        )
        store = FileStore(settings.data_dir)
        up = store.begin_upload(settings.limits.max_file_bytes)
        up.write(jsonl(args.lines))
        file = up.finish(workspace=WORKSPACE, filename="rss.jsonl", purpose="batch")
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
        async with worker_process(settings, tmp) as worker:
            pid = worker.pid
            assert pid is not None
            await asyncio.sleep(1.0)
            idle_kb = status_kb(pid, "VmRSS")
            samples: list[tuple[float, int, int]] = []  # (t, rss kB, upstream in flight)
            stop = asyncio.Event()

            async def sample() -> None:
                t0 = time.monotonic()
                while not stop.is_set():
                    running = sim.app.scheduler.running
                    samples.append((time.monotonic() - t0, status_kb(pid, "VmRSS"), running))
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), 0.1)

            sampler = asyncio.create_task(sample())
            log(f"batch {batch_id}: {args.lines} lines of {args.reply_bytes} B, cap {args.cap}")
            started = time.monotonic()
            handle = await client.start_workflow(
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
                execution_timeout=timedelta(seconds=args.timeout + 60),
            )
            batch = await await_result(client, handle, args.timeout)
            wall = time.monotonic() - started
            stop.set()
            await sampler
            hwm_kb = status_kb(pid, "VmHWM")
    finally:
        await sim.stop()
    if batch.status != "completed" or batch.request_counts.completed != args.lines:
        raise RuntimeError(f"batch ended {batch.status} with {batch.request_counts}")
    peak_in_flight = max(s[2] for s in samples)
    return {
        "lines": args.lines,
        "cap": args.cap,
        "reply_bytes": args.reply_bytes,
        "latency_ms": args.latency_ms,
        "wall_s": round(wall, 1),
        "upstream_peak_in_flight": peak_in_flight,
        "worker_idle_rss_mb": round(idle_kb / 1024, 1),
        "worker_peak_rss_mb": round(hwm_kb / 1024, 1),
        "rss_per_line_in_flight_mb": round(
            (hwm_kb - idle_kb) / 1024 / max(1, min(peak_in_flight, args.cap)), 2
        ),
        "samples": len(samples),
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    clear_settings_env()
    with tempfile.TemporaryDirectory(prefix="backfill-rss-") as tmp_s:
        tmp = Path(tmp_s)
        async with dev_server(tmp) as server:
            client = await connect_client(server.address, server.namespace)
            return await run(client, tmp, args)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lines", type=int, default=512)
    p.add_argument("--cap", type=int, default=256)
    p.add_argument("--reply-bytes", type=int, default=MB)
    p.add_argument("--latency-ms", type=float, default=3000.0)
    p.add_argument("--timeout", type=float, default=600.0)
    args = p.parse_args(argv)
    result = asyncio.run(main_async(args))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
