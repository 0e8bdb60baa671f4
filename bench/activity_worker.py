"""A backfill worker as its own process, for the bench's multi-process modes.

    python bench/activity_worker.py SETTINGS.json READY_FILE [--workflows] [--lag-out FILE]

Without `--workflows`: the same activities as `worker.main.running_worker` (same clients, same
slot count) but no workflows (`--split-worker`: the workflow worker in the bench process no
longer shares an event loop and a GIL with the line activities). With `--workflows`: the real
worker, `running_worker` itself (`--worker-processes N` starts N of these). It writes READY_FILE
once polling and stops on SIGTERM/SIGINT; with `--lag-out`, it then writes its event loop's lag
(p50/p99/max ms, `worker/lag.py`) over its whole run as JSON to FILE.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

from temporalio.client import Client
from temporalio.worker import Worker

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backfill.config import Settings  # noqa: E402
from backfill.dev.devserver import connect_client  # noqa: E402
from backfill.store import FileStore  # noqa: E402
from worker.lag import measuring  # noqa: E402
from worker.main import activities, running_worker, upstream_client  # noqa: E402


@contextlib.asynccontextmanager
async def activities_only(client: Client, settings: Settings) -> AsyncIterator[None]:
    store = FileStore(settings.data_dir)
    async with upstream_client(settings.upstream_keepalive_seconds) as http:
        worker = Worker(
            client,
            task_queue=settings.task_queue,
            activities=activities(settings, store, http, client),
            max_concurrent_activities=settings.worker_max_concurrent_activities,
        )
        async with worker:
            yield


async def main(args: argparse.Namespace) -> None:
    settings = Settings.model_validate_json(args.settings.read_text())
    client = await connect_client(settings.temporal_address, settings.temporal_namespace)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    worker = running_worker(client, settings) if args.workflows else None
    async with measuring() as lag, worker or activities_only(client, settings):
        await asyncio.to_thread(args.ready.write_text, "ready\n")
        await stop.wait()
        if args.lag_out is not None:
            args.lag_out.write_text(json.dumps(lag.take()))


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("settings", type=Path)
    p.add_argument("ready", type=Path)
    p.add_argument("--workflows", action="store_true", help="the whole worker, not activities")
    p.add_argument("--lag-out", type=Path, default=None)
    asyncio.run(main(p.parse_args()))
