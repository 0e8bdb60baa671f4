"""CPU per line of the worker's own part of a line, without Temporal.

    .venv/bin/python bench/run_line_cpu.py --lines 3000 --concurrency 128 [--http-only]

`LineActivities.run_line` (the real one: the FileStore read, the upstream client of
`worker.main`, the fsync'd commit) runs `--lines` lines, `--concurrency` at once, under
temporalio's `ActivityEnvironment`, against the simulator as its own process answering at once.
With `--http-only`, only the upstream client's requests (`POST`, body read); with
`--read-only`, only the store read that starts a line (`LineActivities._read` in the line-store
threads; give it 30,000 lines or more: thread CPU is read in 10 ms ticks). Prints JSON: CPU ms
per line of this process, by thread group (bench.common.thread_cpu_seconds), and lines/s. The
first 200 lines warm up and are not counted.

CPU seconds per line hold up far better than rates on a machine other work shares: this is
how the upstream client's changes were compared (docs/performance.md, dispatch overhead).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from array import array
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench.*` from a plain run

from temporalio.testing import ActivityEnvironment  # noqa: E402

from activities.lines.run_line import LineActivities  # noqa: E402
from backfill.files import FileStore, RouteLines  # noqa: E402
from backfill.platform.config import ModelConfig, RouteConfig, Settings  # noqa: E402
from backfill.platform.ids import new_batch_id  # noqa: E402
from backfill.platform.messages import LineInput  # noqa: E402
from bench.common import _thread_delta, clear_settings_env, thread_cpu_seconds  # noqa: E402
from tools.dev.procs import backfill_argv, free_port, wait_for_port  # noqa: E402
from worker.main import upstream_client  # noqa: E402

WARMUP = 200


def _line(i: int) -> bytes:
    body = {"model": "m", "messages": [{"role": "user", "content": f"hello {i}"}]}
    line = {"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
    return json.dumps(line, separators=(",", ":")).encode()


def _batch(store: FileStore, n: int) -> tuple[str, str]:
    """An indexed batch of n lines on one route, as validation leaves it: (batch id, file id)."""
    lines = [_line(i) for i in range(n)]
    up = store.begin_upload(10**10)
    up.write(b"\n".join(lines) + b"\n")
    f = up.finish(workspace="bench", filename="in.jsonl", purpose="batch")
    batch_id = new_batch_id()
    store.snapshot_input(batch_id, f.id)
    offsets, lengths, pos = array("Q"), array("I"), 0
    for line in lines:
        offsets.append(pos)
        lengths.append(len(line))
        pos += len(line) + 1
    store.write_index(batch_id, offsets, lengths, [RouteLines("r", "m", n)], [array("I", range(n))])
    return batch_id, f.id


async def measure(args: argparse.Namespace, base: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-run-line-") as tmp:
        route = RouteConfig(id="r", base_url=base, max_concurrent_lines=256)
        settings = Settings(data_dir=Path(tmp), models=[ModelConfig(id="m", routes=[route])])
        store = FileStore(settings.data_dir)
        batch_id, file_id = _batch(store, args.lines)
        async with upstream_client(settings.upstream_keepalive_seconds) as http:
            lines = LineActivities(settings, store, http, None)
            env = ActivityEnvironment()
            env.info = dataclasses.replace(env.info, heartbeat_timeout=timedelta(seconds=7))
            sem = asyncio.Semaphore(args.concurrency)

            async def one(i: int) -> None:
                line = LineInput(
                    batch_id=batch_id,
                    input_file_id=file_id,
                    endpoint="/v1/chat/completions",
                    route_id="r",
                    route_index=0,
                    position=i,
                    timeout_seconds=60,
                )
                async with sem:
                    if args.read_only:
                        _, committed, raw = await lines._in_thread(lines._read, line)
                        assert committed is None and raw.startswith(b'{"custom_id"')
                        return
                    if args.http_only:
                        body = json.loads(_line(i))["body"]
                        resp = await http.post(f"{base}/chat/completions", json=body)
                        assert resp.status_code == 200
                        return
                    out = await env.run(lines.run_line, line)
                    assert out.ok, out

            await asyncio.gather(*(one(i) for i in range(WARMUP)))
            t0, w0 = thread_cpu_seconds(), time.perf_counter()
            await asyncio.gather(*(one(i) for i in range(WARMUP, args.lines)))
            cpu, wall = _thread_delta(t0, thread_cpu_seconds()), time.perf_counter() - w0
    n = args.lines - WARMUP
    return {
        "what": "read" if args.read_only else "http" if args.http_only else "run_line",
        "lines": n,
        "concurrency": args.concurrency,
        "cpu_ms_per_line": round(1000 * sum(cpu.values()) / n, 3),
        "by_thread": {k: round(1000 * v / n, 3) for k, v in cpu.items()},
        "lines_per_s": round(n / wall, 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--lines", type=int, default=3000)
    p.add_argument("--concurrency", type=int, default=128)
    p.add_argument("--http-only", action="store_true", help="only the upstream client's requests")
    p.add_argument(
        "--read-only",
        action="store_true",
        help="only run_line's store read (line number, committed check, the line), in its threads",
    )
    args = p.parse_args(argv)
    if args.lines <= WARMUP:
        p.error(f"--lines must be more than {WARMUP}")
    clear_settings_env()
    port = free_port()
    argv = backfill_argv("sim", "--port", str(port), "--any-model", "--max-num-seqs", "1024")
    sim = subprocess.Popen(
        [*argv, "--latency-ms", "0", "--log-level", "warning"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        if not wait_for_port(port, "127.0.0.1", 30):
            raise RuntimeError("simulator did not listen")
        result = asyncio.run(measure(args, f"http://127.0.0.1:{port}/v1"))
    finally:
        sim.terminate()
        sim.wait()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
