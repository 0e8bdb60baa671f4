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

from temporalio.worker import Worker

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backfill.config import Settings  # noqa: E402
from backfill.dev.devserver import connect_client  # noqa: E402
from backfill.store import FileStore  # noqa: E402
from worker.main import activities, upstream_client  # noqa: E402


async def main(settings: Settings, ready_file: Path) -> None:
    client = await connect_client(settings.temporal_address, settings.temporal_namespace)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    store = FileStore(settings.data_dir)
    async with upstream_client(settings.upstream_keepalive_seconds) as http:
        worker = Worker(
            client,
            task_queue=settings.task_queue,
            activities=activities(settings, store, http, client),
            max_concurrent_activities=settings.worker_max_concurrent_activities,
        )
        async with worker:
            await asyncio.to_thread(ready_file.write_text, "ready\n")
            await stop.wait()


if __name__ == "__main__":
    settings = Settings.model_validate_json(Path(sys.argv[1]).read_text())
    asyncio.run(main(settings, Path(sys.argv[2])))
