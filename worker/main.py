"""The worker: runs BatchWorkflow, RouteSchedulerWorkflow, AdmissionWorkflow and their
activities."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any

import httpx
from temporalio.client import Client
from temporalio.worker import PollerBehaviorAutoscaling, Worker

from activities.control import ControlActivities
from activities.finalizing import FinalizeActivities
from activities.heartbeat import MAX_HEARTBEAT_THROTTLE_SECONDS
from activities.lines.run_line import LineActivities
from activities.preemption.board import PreemptBoard
from activities.retention import RetentionActivities
from activities.server_load import ServerLoadActivities
from activities.validation import ValidationActivities
from activities.webhooks import WebhookActivities
from backfill.files import Store, open_store
from backfill.platform import tracing
from backfill.platform.config import (
    Settings,
    WorkerRole,
    configured_bases,
    warn_missing_upstream_keys,
)
from backfill.platform.temporal_client import connect
from backfill.preemption import peers as preempt_peers
from backfill.routes.scheduler_client import configure_routes
from backfill.upstream.load_reader import ServerLoadReader
from backfill.usage.journal import UsageJournal
from worker.exporter import Exporter
from worker.held_back import HeldBackReporter
from worker.lag import log_every
from worker.memory import limit_malloc_arenas
from worker.metrics_server import MetricsServer, sdk_metrics_bind
from worker.preemption.channel import PolicyReader, PreemptChannel
from worker.preemption.peers import PeerSender
from worker.retention import ensure_schedule
from worker.upstream import upstream_client
from workflows.admission import AdmissionWorkflow
from workflows.batch import BatchWorkflow
from workflows.retention import RetentionWorkflow
from workflows.scheduler import RouteSchedulerWorkflow
from workflows.webhooks import WebhookEndpointsWorkflow, WebhookEventWorkflow

log = logging.getLogger(__name__)

ACTIVITY_POLLERS = PollerBehaviorAutoscaling(initial=10)
"""Activity task polls in flight, scaled on the server's feedback (1 to 100). The SDK's default,
5 fixed polls, fetches one task per poll round trip: with 256 lines in flight, lines waited
seconds in the task queue before any worker took them (docs/performance.md)."""


def activities(
    settings: Settings,
    store: Store,
    http: httpx.AsyncClient,
    client: Client,
    usage: UsageJournal | None = None,
    preempt: PreemptBoard | None = None,
) -> list[Callable[..., Any]]:
    """Every activity a worker serves, bound to its clients (one list for every worker kind)."""
    lines = LineActivities(settings, store, http, usage, preempt)
    control = ControlActivities(settings, client)
    load = ServerLoadActivities(ServerLoadReader(configured_bases(settings)), client)
    webhooks = WebhookActivities(settings, client)
    return [
        ValidationActivities(settings, store).validate_input,
        lines.run_line,
        FinalizeActivities(store).finalize_batch,
        control.report_demand,
        control.find_closed_batches,
        RetentionActivities(store, client).delete_expired_files,
        load.watch_server_load,
        webhooks.announce_webhook_event,
        webhooks.deliver_webhook,
    ]


WORKFLOWS = [
    BatchWorkflow,
    RouteSchedulerWorkflow,
    RetentionWorkflow,
    AdmissionWorkflow,
    WebhookEndpointsWorkflow,
    WebhookEventWorkflow,
]
"""Every workflow a worker runs (role `all` or `workflows`)."""
ROLE_NAMES: dict[WorkerRole, str] = {
    "all": "workflows and activities",
    "workflows": "workflows only",
    "activities": "activities only",
}


def runs_workflows(role: WorkerRole) -> bool:
    return role in ("all", "workflows")


def runs_activities(role: WorkerRole) -> bool:
    return role in ("all", "activities")


def eager_options(eager: int) -> dict[str, Any]:
    """The SDK's Worker options for `worker_eager_activities` (0: off; the SDK wants a positive
    reservation count either way). The bench's bare worker uses the same."""
    return {
        "max_eager_activity_reservations_per_workflow_task": max(1, eager),
        "disable_eager_activity_execution": eager == 0,
    }


@contextlib.asynccontextmanager
async def running_worker(
    client: Client,
    settings: Settings,
    *,
    task_queue: str | None = None,
    preempt: PreemptBoard | None = None,
    identity: str | None = None,
) -> AsyncIterator[Worker]:
    """A started worker with its clients; stops it (and closes them) on exit. It runs the
    workflows, the activities or both, as `settings.worker_role` says; a workflows-only worker
    opens no store, usage journal or upstream client."""
    role = settings.worker_role
    async with contextlib.AsyncExitStack() as stack:
        served: list[Callable[..., Any]] = []
        if runs_activities(role):
            store = open_store(settings)
            usage = UsageJournal(settings.data_dir, retention_days=settings.usage_retention_days)
            stack.callback(usage.close)  # after the worker: its last lines' entries too
            http = await stack.enter_async_context(
                upstream_client(settings.upstream_keepalive_seconds)
            )
            served = activities(settings, store, http, client, usage, preempt)
        worker = Worker(
            client,
            task_queue=task_queue or settings.task_queue,
            workflows=WORKFLOWS if runs_workflows(role) else [],
            activities=served,
            max_concurrent_activities=settings.worker_max_concurrent_activities,
            activity_task_poller_behavior=ACTIVITY_POLLERS,
            sticky_queue_schedule_to_start_timeout=timedelta(
                seconds=settings.worker_sticky_queue_timeout_seconds
            ),
            max_heartbeat_throttle_interval=timedelta(seconds=MAX_HEARTBEAT_THROTTLE_SECONDS),
            **eager_options(settings.worker_eager_activities),
            graceful_shutdown_timeout=timedelta(seconds=settings.shutdown_grace_seconds),
            **traced_sandbox(),
            identity=identity,
        )
        async with worker:
            yield worker


def traced_sandbox() -> dict[str, Any]:
    """With tracing on, the workflow sandbox passes `opentelemetry` through (the interceptor
    comes with the client)."""
    runner = tracing.workflow_runner()
    return {"workflow_runner": runner} if runner is not None else {}


class StopSignals:
    """The first SIGTERM/SIGINT asks for a graceful stop (`requested` is set: the worker stops
    polling and lets its running lines finish); a second one exits the process at once."""

    def __init__(self, grace_seconds: float) -> None:
        self.requested = asyncio.Event()
        self.grace_seconds = grace_seconds

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.received, sig)

    def received(self, sig: int) -> None:
        name = signal.Signals(sig).name
        if not self.requested.is_set():
            log.info(
                "%s: worker stopping: no new lines; running lines get up to %g s to finish "
                "(a second signal exits at once)",
                name,
                self.grace_seconds,
            )
            self.requested.set()
            return
        log.warning("%s again: exiting at once; running lines are lost and run again", name)
        logging.shutdown()  # flush the log before leaving without cleanup
        os._exit(128 + sig)


def start_metrics(
    settings: Settings, sdk_bind: str, preempt: PreemptChannel | None = None
) -> MetricsServer | None:
    """The worker's `/metrics` (ours and the SDK's), or None when its port is taken: the
    worker still runs (its lines matter more than its metrics); the scrape target shows down."""
    try:
        server = MetricsServer(
            settings.worker_metrics_host, settings.worker_metrics_port, sdk_bind, preempt
        )
    except OSError as err:
        log.error(
            "worker /metrics cannot listen on %s:%s: %s",
            settings.worker_metrics_host,
            settings.worker_metrics_port,
            err,
        )
        return None
    log.info("worker /metrics on %s:%s", settings.worker_metrics_host, server.port)
    return server.start()


async def serve(settings: Settings) -> None:
    tracing.setup("backfill-worker")  # off unless OTEL_* asks (docs/operator-guide.md)
    sdk_bind = sdk_metrics_bind()
    client = await connect(settings, metrics_bind=sdk_bind, interceptors=tracing.interceptors())
    # Preemptive yield's direct channel: only with its shared token (decision 0023).
    board, channel, held_back, policies, peers = None, None, None, None, None
    if settings.preempt_token and runs_activities(settings.worker_role):
        routes = [r.id for m in settings.models for r in m.routes]
        held_back = HeldBackReporter(client).start()
        board = PreemptBoard(
            on_held_back=held_back.changed,
            worker=held_back.worker,
            max_peers=settings.preempt_max_peers,
            max_peer_lines=settings.preempt_max_peer_lines,
        )
        policies = PolicyReader(client, board, routes).start()
        loop = asyncio.get_running_loop()
        channel = PreemptChannel(
            board, loop, settings.preempt_token, routes, worker=held_back.worker
        )
    metrics_server = start_metrics(settings, sdk_bind, channel)
    exporter = asyncio.create_task(Exporter(client, settings).run())
    signals = StopSignals(settings.shutdown_grace_seconds)
    signals.install(asyncio.get_running_loop())
    if runs_activities(settings.worker_role):
        warn_missing_upstream_keys(settings)
    await ensure_schedule(client, settings)
    await configure_routes(client, settings)  # the config file's route settings (decision 0039)
    lag_task = None
    if settings.worker_loop_lag_log_seconds is not None:
        lag_task = asyncio.create_task(log_every(settings.worker_loop_lag_log_seconds))
    # The api processes find this worker's channel from its identity on the task queue.
    identity = None
    if board is not None and held_back is not None and metrics_server is not None:
        own_url = preempt_peers.channel_url(settings.worker_metrics_host, metrics_server.port)
        identity = preempt_peers.identity(own_url)
        # The other workers count this one's lines, and it theirs (decision 0035).
        peers = PeerSender(
            client,
            board,
            worker=held_back.worker,
            own_url=own_url,
            task_queue=settings.task_queue,
            token=settings.preempt_token or "",
            networks=preempt_peers.parse_networks(settings.preempt_networks),
        ).start()
        board.on_lines = peers.changed
    async with running_worker(client, settings, preempt=board, identity=identity):
        log.info(
            "worker (%s) polling task queue %r at %s",
            ROLE_NAMES[settings.worker_role],
            settings.task_queue,
            settings.temporal_address,
        )
        await signals.requested.wait()
        if lag_task is not None:
            lag_task.cancel()
        exporter.cancel()
    if metrics_server is not None:
        metrics_server.stop()
    if held_back is not None:
        await held_back.stop()
    if policies is not None:
        await policies.stop()
    if peers is not None:
        await peers.stop()
    # Leaving the block shut the worker down: polling stopped at once, running activities had
    # up to `graceful_shutdown_timeout` (they keep heartbeating meanwhile), then were cancelled.
    log.info("worker stopped")


def run(settings: Settings) -> None:
    limit_malloc_arenas()  # before any thread starts
    asyncio.run(serve(settings))
