"""Batches of 1k, 50k and 200k lines end to end: time, rate, memory, histories (issue 14).

    .venv/bin/python -m bench.scale --lines 1000,50000,200000 --cap 64 --out /tmp/scale.json

For each size, on its own private dev server (SQLite file): the real api and worker as their own
processes (`python -m tools api|worker`, started by tests/e2e/stack.py's `Stack`), the
simulator in this process answering at once (`--latency-ms` 0), one route whose
`max_concurrent_lines` is `--cap`, `[limits] max_lines_per_batch` raised to the size. A JSONL file
of `--lines` chat lines, each padded to `--line-bytes` bytes (1,000: 200,000 lines are a 200 MB
file), is uploaded through `POST /v1/files` (streamed from disk) and a batch is created with
`POST /v1/batches`; the batch is polled every `--poll-s` seconds until it ends.

Measured: upload time; wall time from create to the terminal status, and lines/s over it; the
api's peak RSS while the file uploads and the batch validates (the kernel's high-water mark,
VmHWM, read once validation ended: the api did nothing else before); the worker's peak RSS over
the whole batch (VmHWM at the end) and the highest sampled RSS per phase (validating,
in_progress, finalizing; sampled every 0.1 s); the batch's history events per run and its
number of runs (read back from every run of its continue-as-new chain).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench.*` from a plain run

import httpx  # noqa: E402

from bench.common import (  # noqa: E402
    analyze_chain,
    clear_settings_env,
    dev_server,
    first_run_id,
    log,
    proc_cpu_seconds,
)
from bench.worker_rss import status_kb  # noqa: E402
from tests.e2e.stack import API_KEY, Stack  # noqa: E402
from tools.dev.devserver import connect_client  # noqa: E402
from tools.sim import SimConfig  # noqa: E402

TERMINAL = ("completed", "failed", "expired", "cancelled")
MB = 1024 * 1024


def write_input(path: Path, n: int, line_bytes: int) -> int:
    """An n-line chat file, each line padded to about `line_bytes` bytes; returns its size."""
    size = 0
    with open(path, "wb") as f:
        for i in range(n):
            line = {
                "custom_id": f"req-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": "demo", "messages": [{"role": "user", "content": ""}]},
            }
            bare = len(json.dumps(line))
            line["body"]["messages"][0]["content"] = "x" * max(0, line_bytes - 1 - bare)  # type: ignore[index]
            data = json.dumps(line).encode() + b"\n"
            f.write(data)
            size += len(data)
    return size


class Sampler:
    """RSS of named processes every 0.1 s, the highest value kept per (process, phase)."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.phase = "idle"
        self.peaks: dict[str, dict[str, int]] = {name: {} for name in pids}
        self._stop = asyncio.Event()

    async def run(self) -> None:
        while not self._stop.is_set():
            for name, pid in self.pids.items():
                kb = status_kb(pid, "VmRSS")
                phases = self.peaks[name]
                phases[self.phase] = max(phases.get(self.phase, 0), kb)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), 0.1)

    def stop(self) -> None:
        self._stop.set()

    def mib(self) -> dict[str, dict[str, float]]:
        return {
            name: {phase: round(kb / 1024, 1) for phase, kb in phases.items()}
            for name, phases in self.peaks.items()
        }


async def one_size(args: argparse.Namespace, n: int, root: Path) -> dict[str, Any]:
    tmp = root / f"lines-{n}"
    tmp.mkdir()
    path = tmp / "input.jsonl"
    size = write_input(path, n, args.line_bytes)
    log(f"{n} lines: {size / 1e6:.1f} MB input written")
    async with dev_server(tmp, dynamic_config=args.dynamic_config) as server:
        stack = Stack(
            tmp,
            server.address,
            cap=args.cap,
            sim=SimConfig(model_names=[], latency_ms=args.latency_ms, max_num_seqs=1024),
            limits={"max_lines_per_batch": max(50_000, n), "max_file_bytes": max(size, 200 * MB)},
            extra_env={
                "BACKFILL_LOG_LEVEL": "WARNING",
                **dict(kv.split("=", 1) for kv in args.env),
            },
        )
        async with stack.running():
            api_pid, worker_pid = stack.api.pid, stack.workers[0].pid
            assert api_pid is not None and worker_pid is not None
            await asyncio.sleep(1.0)
            idle = {"api": status_kb(api_pid, "VmRSS"), "worker": status_kb(worker_pid, "VmRSS")}
            sampler = Sampler({"api": api_pid, "worker": worker_pid})
            sampling = asyncio.create_task(sampler.run())
            cpu0 = {
                p: proc_cpu_seconds(pid) for p, pid in (("api", api_pid), ("worker", worker_pid))
            }
            cpu0["server"] = proc_cpu_seconds(server.pid)
            headers = {"Authorization": f"Bearer {API_KEY}"}
            try:
                async with httpx.AsyncClient(
                    base_url=stack.api_url, headers=headers, timeout=600
                ) as http:
                    sampler.phase = "upload"
                    t_up = time.monotonic()
                    with open(path, "rb") as f:  # noqa: ASYNC230 - httpx streams it
                        resp = await http.post(
                            "/v1/files",
                            files={"file": ("input.jsonl", f, "application/jsonl")},
                            data={"purpose": "batch"},
                        )
                    resp.raise_for_status()
                    upload_s = time.monotonic() - t_up
                    file_id = resp.json()["id"]
                    log(f"{n} lines: uploaded in {upload_s:.1f} s")
                    sampler.phase = "validating"
                    t0 = time.monotonic()
                    resp = await http.post(
                        "/v1/batches",
                        json={
                            "input_file_id": file_id,
                            "endpoint": "/v1/chat/completions",
                            "completion_window": "24h",
                        },
                    )
                    resp.raise_for_status()
                    batch = resp.json()
                    batch_id = batch["id"]
                    validated_s: float | None = None
                    api_hwm_kb = 0
                    last_log = 0.0
                    while batch["status"] not in TERMINAL:
                        if time.monotonic() - t0 > args.timeout:
                            raise TimeoutError(f"{batch_id} still {batch['status']}")
                        await asyncio.sleep(args.poll_s)
                        batch = (await http.get(f"/v1/batches/{batch_id}")).json()
                        status = batch["status"]
                        if status != "validating" and validated_s is None:
                            validated_s = time.monotonic() - t0
                            api_hwm_kb = status_kb(api_pid, "VmHWM")
                        if status in ("in_progress", "finalizing"):
                            sampler.phase = status
                        if time.monotonic() - last_log > 30:
                            last_log = time.monotonic()
                            log(f"{n} lines: {status} {batch['request_counts']}")
                    wall = time.monotonic() - t0
                    worker_hwm_kb = status_kb(worker_pid, "VmHWM")
                    cpu = {
                        p: proc_cpu_seconds(pid)
                        for p, pid in (("api", api_pid), ("worker", worker_pid))
                    }
                    cpu["server"] = proc_cpu_seconds(server.pid)
            finally:
                sampler.stop()
                await sampling
            counts = batch["request_counts"]
            log(f"{n} lines: {batch['status']} {counts} in {wall:.1f} s")
            temporal = await connect_client(server.address, server.namespace)
            first = await first_run_id(temporal, batch_id)
            hist = (await analyze_chain(temporal, batch_id, first, "run_line")).summary("run_line")
    events_per_run = hist["events_per_run"]
    return {
        "lines": n,
        "cap": args.cap,
        "input_bytes": size,
        "status": batch["status"],
        "request_counts": counts,
        "upload_s": round(upload_s, 1),
        "validate_s": round(validated_s or 0.0, 1),
        "wall_s": round(wall, 1),
        "lines_per_s": round(n / wall, 1),
        "api_idle_rss_mib": round(idle["api"] / 1024, 1),
        "api_peak_rss_upload_validate_mib": round(api_hwm_kb / 1024, 1),
        "worker_idle_rss_mib": round(idle["worker"] / 1024, 1),
        "worker_peak_rss_mib": round(worker_hwm_kb / 1024, 1),
        "rss_peaks_by_phase_mib": sampler.mib(),
        "cpu_s": {p: round(cpu[p] - cpu0[p], 1) for p in cpu},
        "runs": hist["runs"],
        "events": hist["events"],
        "events_per_run_max": max(events_per_run),
        "events_per_run_median": sorted(events_per_run)[len(events_per_run) // 2],
        "events_per_line": hist["events_per_line"],
        "wft_timeouts": hist["wft_timeouts"],
        "wft_failures": hist["wft_failures"],
        "continue_as_new_idle_s": hist["continue_as_new_idle_s"],
        "continue_as_new_drain_tail_s": hist["continue_as_new_drain_tail_s"],
        "finalize_s": hist["other_activities"]
        .get("finalize_batch", {})
        .get("total_schedule_to_close_s"),
        "dynamic_config": list(args.dynamic_config),
        "env": list(args.env),
    }


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| lines | wall s | lines/s | api peak MiB (upload+validate) | worker peak MiB "
        "| runs | events/run (max) | validate s | finalize s |\n"
        "|---|---|---|---|---|---|---|---|---|"
    )
    body = [
        f"| {r['lines']:,} | {r['wall_s']} | {r['lines_per_s']} | "
        f"{r['api_peak_rss_upload_validate_mib']} | {r['worker_peak_rss_mib']} | {r['runs']} | "
        f"{r['events_per_run_median']} ({r['events_per_run_max']}) | {r['validate_s']} | "
        f"{r['finalize_s']} |"
        for r in rows
    ]
    return "\n".join([head, *body])


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    clear_settings_env()
    rows = []
    with tempfile.TemporaryDirectory(prefix="backfill-scale-", dir=args.tmp) as tmp_s:
        for n in args.lines:
            row = await one_size(args, n, Path(tmp_s))
            rows.append(row)
            log(json.dumps(row))
            if args.out:
                Path(args.out).write_text(json.dumps(rows, indent=2))  # noqa: ASYNC240
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--lines", type=lambda s: [int(x) for x in s.split(",")], default=[1000, 50_000, 200_000]
    )
    p.add_argument("--cap", type=int, default=64)
    p.add_argument("--line-bytes", type=int, default=1000)
    p.add_argument("--latency-ms", type=float, default=0.0)
    p.add_argument("--poll-s", type=float, default=1.0)
    p.add_argument("--timeout", type=float, default=4 * 3600)
    p.add_argument("--dynamic-config", action="append", default=[], metavar="KEY=JSON")
    p.add_argument(
        "--env", action="append", default=[], metavar="KEY=VALUE", help="for the api and worker"
    )
    p.add_argument("--tmp", default=None, help="parent of the temporary directory")
    p.add_argument("--out", default=None, help="write the rows as JSON here after each size")
    args = p.parse_args(argv)
    rows = asyncio.run(main_async(args))
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
