"""The FastAPI app: OpenAI Files and Batches APIs, the live proxy, health and metrics.

Nothing here waits for Temporal: the client connects in the background (`TemporalLink`), so the
api starts, and the live proxy serves, while Temporal is down."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

import httpx
from fastapi import FastAPI
from temporalio.client import Client

from api import console, errors, health
from api.batches import batches_api as batches
from api.batches import results as partial_results
from api.console.sampler import RouteSampler
from api.files import files_api as files
from api.jobs import jobs_api as jobs
from api.live import proxy
from api.live.limits import LiveLimits
from api.live.relay import RelayBudget
from api.live.reporter import LiveReporter
from api.live.traffic import LiveTraffic
from api.middleware import UPLOAD_FORM_OVERHEAD, BodyLimit, BodyRule, CatchAll
from api.platform_admin import batches as admin_batches
from api.platform_admin import jobs as admin_jobs
from api.preemption.push import PreemptSender
from api.request_id import RequestIdMiddleware
from api.request_spans import RequestSpans
from api.routes import routes_api as admin
from api.routes.poller import RoutePoller
from api.temporal_link import RETRY, BoundedRPCs, TemporalLink
from api.usage import usage_api as admin_usage
from api.webhooks import webhooks_api as webhooks
from backfill.files import CHUNK_BYTES, open_store
from backfill.platform import tracing
from backfill.platform.config import Settings
from backfill.platform.temporal_client import connect
from backfill.preemption.peers import parse_networks
from backfill.tenancy.byte_budget import ByteBudget
from backfill.upstream import endpoints
from backfill.usage.journal import UsageJournal

UPSTREAM_LIMITS = httpx.Limits(
    max_connections=1024, max_keepalive_connections=128, keepalive_expiry=2.0
)
"""One pool for every upstream; idle connections are dropped after 2 s, before the model
server's own keep-alive (uvicorn's and vLLM's 5 s) can close one under a new request."""


def create_app(settings: Settings, client: Client | None = None) -> FastAPI:
    """Build the app; it connects to Temporal in the background unless a client is given."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.settings = settings
        app.state.store = open_store(settings)
        app.state.usage = UsageJournal(
            settings.data_dir, retention_days=settings.usage_retention_days
        )
        app.state.live = LiveTraffic(r.id for m in settings.models for r in m.routes)
        app.state.live_limits = LiveLimits()
        app.state.live_budget = RelayBudget(settings.limits.live_buffer_total_bytes)
        app.state.usage_buffers = ByteBudget(
            settings.api_usage_buffer_bytes,
            settings.api_usage_buffer_workspace_bytes,
            name="api_usage",
        )
        if client is not None:
            link = TemporalLink.connected(client)
        else:
            link = TemporalLink(
                lambda: connect(
                    settings,
                    interceptors=[BoundedRPCs(), *tracing.interceptors()],
                    retry_config=RETRY,
                )
            )
        app.state.temporal = link
        link.start()
        poller = RoutePoller(link)  # one reader of each route's scheduler for the loops below
        reporter = LiveReporter(
            app.state.live, link, [r.id for m in settings.models for r in m.routes], poller
        )
        reporter.start()
        app.state.live_reporter = reporter
        preempt = preempt_sender(settings, app.state.live, link, reporter.me, poller)
        app.state.preempt = preempt
        sampler = RouteSampler(
            app.state.console.samples,
            link,
            [(r.id, r.max_concurrent_lines) for m in settings.models for r in m.routes],
            poller,
        )
        sampler.start()
        try:
            async with httpx.AsyncClient(
                trust_env=False, follow_redirects=False, limits=UPSTREAM_LIMITS
            ) as http:
                app.state.http = http
                yield
        finally:
            await sampler.stop()
            if preempt is not None:
                await preempt.stop()
            await reporter.stop()
            await poller.close()
            await link.stop()
            app.state.usage.close()

    # No /docs or /redoc: their pages load scripts from a CDN onto the console's origin.
    # The schema stays at /openapi.json.
    # FastAPI's own OpenTelemetry spans are off: the api's spans are `RequestSpans`' (one per
    # request, identifiers only; decision 0030).
    app = FastAPI(
        title="backfill",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    errors.install(app)
    buffers = ByteBudget(
        settings.api_buffer_bytes, settings.api_buffer_workspace_bytes, name="api_requests"
    )
    app.state.buffers = buffers  # request bodies and answers built whole (`api.buffers`)
    # Added innermost first: every answer gets an X-Request-ID, then bodies are bounded before
    # any route, key check or parsing runs, then unexpected errors become 500 envelopes.
    app.add_middleware(CatchAll)
    app.add_middleware(
        BodyLimit,
        rule_for=body_rules(settings),
        key_known=lambda k: settings.key_for(k) is not None,
        budget=buffers,
        tenant_of=lambda k: key.workspace if (key := settings.key_for(k)) else "",
    )
    app.add_middleware(RequestSpans)  # when tracing is on; inside, so it knows the request id
    app.add_middleware(RequestIdMiddleware)
    app.include_router(files.router)
    app.include_router(batches.router)
    app.include_router(jobs.router)  # /gateway/v1/batches: single jobs over batches
    app.include_router(partial_results.router)  # GET /v1/batches/{id}/results (extension)
    app.include_router(proxy.router)
    app.include_router(health.router)
    app.include_router(admin.router)
    app.include_router(admin_batches.router)
    app.include_router(admin_jobs.router)  # /gateway/ui-api/batches: every workspace's jobs
    app.include_router(admin_usage.router)
    app.include_router(webhooks.router)
    console.install(app)  # /console: the web console (not in the OpenAPI schema)
    return app


def preempt_sender(
    settings: Settings,
    live: LiveTraffic,
    link: TemporalLink,
    process: str,
    poller: RoutePoller | None = None,
) -> PreemptSender | None:
    """Preemptive yield's sender of live counts to the workers (decision 0023), started; None
    without its token. The workers are found on the task queue (decision 0034), plus any listed
    in `BACKFILL_PREEMPT_WORKER_URLS`."""
    urls = [u.strip() for u in settings.preempt_worker_urls.split(",") if u.strip()]
    if not settings.preempt_token:
        return None
    routes = [r.id for m in settings.models for r in m.routes]
    sender = PreemptSender(
        live,
        link,
        routes,
        urls,
        settings.preempt_token,
        process,
        task_queue=settings.task_queue,
        poller=poller,
        networks=parse_networks(settings.preempt_networks),
    )
    sender.start()
    return sender


LIVE_PATHS = endpoints.LIVE_PATHS


def body_rules(settings: Settings) -> Callable[[str, str], BodyRule]:
    """The rule for the request body at (method, path)."""
    limits = settings.limits
    upload = BodyRule(
        max_bytes=limits.max_file_bytes + UPLOAD_FORM_OVERHEAD,
        streamed=True,
        code="file_too_large",
        param="file",
        message=f"File is too large: the limit is {limits.max_file_bytes} bytes.",
        held_bytes=settings.s3_part_bytes + CHUNK_BYTES,
    )
    live = BodyRule(max(limits.max_request_bytes, limits.max_line_bytes))
    other = BodyRule(limits.max_request_bytes)
    console = BodyRule(limits.max_request_bytes, keyed=False)  # its forms carry a session

    def rule_for(method: str, path: str) -> BodyRule:
        if path == "/console" or path.startswith("/console/"):
            return console
        if path.rstrip("/") == "/v1/files":
            return upload
        if path in LIVE_PATHS:
            return live
        return other

    return rule_for
