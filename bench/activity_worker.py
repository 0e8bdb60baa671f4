"""A backfill worker as its own process, for the bench's multi-process modes.

    python bench/activity_worker.py SETTINGS.json READY_FILE [--role ROLE] [--lag-out FILE]

The real worker, `worker.main.running_worker`, in the role given (`BACKFILL_WORKER_ROLE`):
`--split-worker` starts one with `--role activities` (the workflows-only worker stays in the bench
process), `--worker-processes N` starts N whole ones (`--role all`). It writes READY_FILE
once polling and stops on SIGTERM/SIGINT; with `--lag-out`, it then writes its event loop's lag
(p50/p99/max ms, `worker/lag.py`) over its whole run as JSON to FILE.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import get_args

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backfill.platform.config import Settings, WorkerRole  # noqa: E402
from bench.ablate import ablated  # noqa: E402
from tools.dev.devserver import connect_client  # noqa: E402
from worker.lag import measuring  # noqa: E402
from worker.main import running_worker  # noqa: E402


async def main(args: argparse.Namespace) -> None:
    settings = Settings.model_validate_json(args.settings.read_text())
    client = await connect_client(settings.temporal_address, settings.temporal_namespace)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    settings = settings.model_copy(update={"worker_role": args.role})
    ablations = [x for x in args.ablate.split(",") if x]
    with ablated(ablations, args.latency_s):
        async with measuring() as lag, running_worker(client, settings):
            await asyncio.to_thread(args.ready.write_text, "ready\n")
            await stop.wait()
            if args.lag_out is not None:
                args.lag_out.write_text(json.dumps(lag.take()))


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("settings", type=Path)
    p.add_argument("ready", type=Path)
    p.add_argument(
        "--role", choices=get_args(WorkerRole), default="all", help="BACKFILL_WORKER_ROLE"
    )
    p.add_argument("--lag-out", type=Path, default=None)
    p.add_argument("--ablate", default="", help="comma-separated bench/ablate.py ablations")
    p.add_argument("--latency-s", type=float, default=0.0, help="the canned answer's wait")
    asyncio.run(main(p.parse_args()))
