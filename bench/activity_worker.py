"""An activities-only backfill worker, as its own process (the bench's `--split-worker` mode).

    python bench/activity_worker.py SETTINGS.json READY_FILE

Runs the same activities as `worker.main.running_worker` (same clients, same slot count) but no
workflows, so the workflow worker in the bench process no longer shares an event loop (and a
GIL) with the line activities. It writes READY_FILE once polling and stops on SIGTERM/SIGINT.
This is a what-if topology for measuring, not how backfill is deployed today.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import httpx
from temporalio.worker import Worker

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from activities.control import ControlActivities  # noqa: E402
from activities.lines import LineActivities  # noqa: E402
from backfill.config import Settings  # noqa: E402
from backfill.devserver import connect_client  # noqa: E402
from backfill.store import FileStore  # noqa: E402


async def main(settings: Settings, ready_file: Path) -> None:
    client = await connect_client(settings.temporal_address, settings.temporal_namespace)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    store = FileStore(settings.data_dir)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
    async with httpx.AsyncClient(limits=limits, follow_redirects=False, trust_env=False) as http:
        lines = LineActivities(settings, store, http)
        control = ControlActivities(settings, client)
        worker = Worker(
            client,
            task_queue=settings.task_queue,
            activities=[
                lines.validate_input,
                lines.run_line,
                lines.finalize_batch,
                control.report_demand,
                control.find_closed_batches,
            ],
            max_concurrent_activities=settings.worker_max_concurrent_activities,
        )
        async with worker:
            await asyncio.to_thread(ready_file.write_text, "ready\n")
            await stop.wait()


if __name__ == "__main__":
    settings = Settings.model_validate_json(Path(sys.argv[1]).read_text())
    asyncio.run(main(settings, Path(sys.argv[2])))
