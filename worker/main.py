"""The worker: runs BatchWorkflow, RouteSchedulerWorkflow and their activities."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any

import httpx
from temporalio.client import Client
from temporalio.worker import Worker

from activities.control import ControlActivities
from activities.finalizing import FinalizeActivities
from activities.lines import LineActivities
from activities.load_metrics import configured_bases
from activities.retention import RetentionActivities
from activities.server_load import ServerLoadActivities, ServerLoadReader
from activities.validation import ValidationActivities
from backfill.config import Settings
from backfill.store import FileStore
from backfill.temporal_client import connect
from worker.retention import ensure_schedule
from workflows.batch import BatchWorkflow
from workflows.retention import RetentionWorkflow
from workflows.scheduler import RouteSchedulerWorkflow

log = logging.getLogger(__name__)


def activities(
    settings: Settings, store: FileStore, http: httpx.AsyncClient, client: Client
) -> list[Callable[..., Any]]:
    """Every activity a worker serves, bound to its clients (one list for every worker kind)."""
    lines = LineActivities(settings, store, http)
    control = ControlActivities(settings, client)
    load = ServerLoadActivities(ServerLoadReader(configured_bases(settings)), client)
    return [
        ValidationActivities(settings, store).validate_input,
        lines.run_line,
        FinalizeActivities(store).finalize_batch,
        control.report_demand,
        control.find_closed_batches,
        RetentionActivities(store).delete_expired_files,
        load.read_server_load,
        load.watch_server_load,
    ]


def upstream_client() -> httpx.AsyncClient:
    """The httpx client for model servers: pooled, no redirects, no proxies from the env."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
    return httpx.AsyncClient(limits=limits, follow_redirects=False, trust_env=False)


@contextlib.asynccontextmanager
async def running_worker(
    client: Client, settings: Settings, *, task_queue: str | None = None
) -> AsyncIterator[Worker]:
    """A started worker with its clients; stops it (and closes them) on exit."""
    store = FileStore(settings.data_dir)
    async with upstream_client() as http:
        worker = Worker(
            client,
            task_queue=task_queue or settings.task_queue,
            workflows=[BatchWorkflow, RouteSchedulerWorkflow, RetentionWorkflow],
            activities=activities(settings, store, http, client),
            max_concurrent_activities=settings.worker_max_concurrent_activities,
            sticky_queue_schedule_to_start_timeout=timedelta(seconds=2),
        )
        async with worker:
            yield worker


async def serve(settings: Settings) -> None:
    client = await connect(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await ensure_schedule(client, settings)
    async with running_worker(client, settings):
        log.info(
            "worker polling task queue %r at %s", settings.task_queue, settings.temporal_address
        )
        await stop.wait()
        log.info("worker stopping")


def run(settings: Settings) -> None:
    asyncio.run(serve(settings))
