"""The server-load activity: a route's watcher of its model server's `/metrics` (decision 0011),
around the process's one `backfill.upstream.load_reader.ServerLoadReader`."""

from __future__ import annotations

import asyncio
import contextlib

from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError

from backfill.platform import refs
from backfill.platform.ids import scheduler_workflow_id
from backfill.routes.gates.server_load import WatchLoadInput, judge
from backfill.upstream.load_reader import ServerLoadReader, export_reading

WATCH_EVERY = 5.0
"""Seconds between readings while a route's scheduler watches (a reading is reused 5 s)."""


class ServerLoadActivities:
    """The server-load activities around the process's one `ServerLoadReader`."""

    def __init__(self, reader: ServerLoadReader, client: Client | None = None) -> None:
        self.reader = reader
        self.client = client

    @activity.defn
    async def watch_server_load(self, input: WatchLoadInput) -> None:
        """Read the route's server metrics every `WATCH_EVERY` seconds, for as long as the route's
        scheduler wants (it cancels this), and signal it only when the verdict changes: a
        steady server adds nothing to the scheduler's history."""
        assert self.client is not None, "watch_server_load needs a Temporal client"
        handle = self.client.get_workflow_handle_for(
            refs.RouteSchedulerWorkflow.run, scheduler_workflow_id(input.route_id)
        )
        last: str | None = None
        while True:
            reading = await self.reader.read(input.settings.metrics_url)
            export_reading(input.route_id, reading)
            verdict = judge(input.settings, reading)
            if verdict.state != last:  # not on every new figure: only what flips the gate
                await handle.signal(refs.RouteSchedulerWorkflow.server_load, verdict)
                last = verdict.state
            activity.heartbeat()
            # A worker shutting down waits for its running activities: this one never ends by
            # itself, so it fails (retryable) and the scheduler's retry runs it on another worker.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(activity.wait_for_worker_shutdown(), WATCH_EVERY)
            if activity.is_worker_shutdown():
                raise ApplicationError("worker shutting down", type="WorkerShutdown")
