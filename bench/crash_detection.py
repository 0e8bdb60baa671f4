"""Crash detection: time from a worker's SIGKILL to its lost lines running again elsewhere.

    .venv/bin/python -m bench.crash_detection --runs 3

Each run: a private stack (the bench's own dev server, the simulator, an api and **two real
worker processes**), a batch of `--lines` lines on a route capped at `--cap`, the simulator
answering after `--latency-ms` (long enough that lines are still running at the kill and that
their re-runs are still running when looked at). Once `--cap` lines are in flight at the
upstream, the bench waits a random 0-`--jitter` s (so the kill falls anywhere between two
heartbeats), picks the victim (`--victim sticky`: the worker that ran the batch's last workflow
task, so the batch's next workflow task also waits for that worker's sticky queue to time out,
the worst case; `--victim other`: the other one) and SIGKILLs it.

Lost lines = the batch's pending activities started by the victim at the kill (Temporal's
`DescribeWorkflowExecution`). For each, the bench polls until an activity for the same line
(same route and position, read from the scheduled events' inputs) has been started by the other
worker, and reports per run: the lost lines, when their activities timed out (detection: the
heartbeat timeout), and when the last one was running again on the other worker (the figure that
matters: every lost line is running again). All times are seconds after the SIGKILL, on this
machine's clock (the dev server runs on it too).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench.*` from a plain run

from bench.common import clear_settings_env, dev_server, log  # noqa: E402
from tests.e2e.crash import Victim, kill_and_time_recovery  # noqa: E402
from tests.e2e.stack import Stack, submit, wait_in_flight  # noqa: E402
from tools.dev.devserver import connect_client  # noqa: E402
from tools.sim import SimConfig  # noqa: E402


async def one_run(
    tmp: Path,
    address: str,
    *,
    lines: int,
    cap: int,
    latency_ms: float,
    jitter: float,
    victim: Victim,
) -> dict[str, Any]:
    stack = Stack(tmp, address, cap=cap, sim=SimConfig(model_names=[], latency_ms=latency_ms))
    async with stack.running(workers=2):
        client = await connect_client(address)
        batch_id = await submit(stack, lines)
        await wait_in_flight(stack, cap)
        delay = random.uniform(0.0, jitter)
        await asyncio.sleep(delay)  # where the kill falls between two heartbeats (not a race)
        r = await kill_and_time_recovery(client, batch_id, stack.workers, victim)
        return {
            "victim": r.victim,
            "kill_delay_s": round(delay, 2),
            "lost_lines": r.lost_lines,
            "timed_out_s": r.timed_out_s,
            "running_again_s": r.running_again_s,
            "last_running_again_s": r.last_running_again_s,
        }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    clear_settings_env()
    with tempfile.TemporaryDirectory(prefix="bench-crash-") as tmp_s:
        tmp = Path(tmp_s)
        async with dev_server(tmp) as server:
            runs = []
            for i in range(args.runs):
                run_tmp = tmp / f"run{i}"
                run_tmp.mkdir()
                out = await one_run(
                    run_tmp,
                    server.address,
                    lines=args.lines,
                    cap=args.cap,
                    latency_ms=args.latency_ms,
                    jitter=args.jitter,
                    victim=args.victim,
                )
                log(f"run {i + 1}: {out}")
                runs.append(out)
    worst = [r["last_running_again_s"] for r in runs if r["last_running_again_s"] is not None]
    return {
        "lines": args.lines,
        "cap": args.cap,
        "latency_ms": args.latency_ms,
        "victim": args.victim,
        "runs": runs,
        "last_running_again_s": {
            "median": round(statistics.median(worst), 2) if worst else None,
            "max": max(worst) if worst else None,
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--lines", type=int, default=24)
    p.add_argument("--cap", type=int, default=8)
    p.add_argument("--latency-ms", type=float, default=30_000.0)
    p.add_argument("--jitter", type=float, default=8.0, help="random wait before the kill, s")
    p.add_argument("--victim", choices=("sticky", "other", "busiest"), default="sticky")
    args = p.parse_args(argv)
    result = asyncio.run(main_async(args))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
