"""`backfill api`: serve the app with uvicorn.

Around the app, for the process only: the `Host` allow-list (`Settings.allowed_hosts`), HSTS over
https, the proxies whose forwarded headers are believed (`forwarded_allow_ips`), and the key-less
`/metrics` port when one is configured (`api_metrics_port`)."""

from __future__ import annotations

import contextlib
import logging

import uvicorn
from prometheus_client import start_http_server
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.types import ASGIApp

from api.app import create_app
from api.live.connection_cut import CuttableH11Protocol
from api.middleware import HstsOverHttps
from backfill.platform import tracing
from backfill.platform.config import Settings, check_exposure, warn_missing_upstream_keys

log = logging.getLogger(__name__)

MAX_HEADER_BYTES = 16 * 1024
"""The most of a request line and headers the api holds before they are complete; more answers
400 and closes the connection (h11's `max_incomplete_event_size`, set explicitly)."""


def around(app: ASGIApp, settings: Settings) -> ASGIApp:
    """`app` as the process serves it: unknown `Host` names refused (400), HSTS over https."""
    app = HstsOverHttps(app)
    hosts = settings.allowed_hosts()
    if hosts != ["*"]:
        app = TrustedHostMiddleware(app, allowed_hosts=hosts)
    return app


def server_config(settings: Settings, app: ASGIApp) -> uvicorn.Config:
    """uvicorn's settings for the api process, serving `app` (wrapped by `around`)."""
    return uvicorn.Config(
        around(app, settings),
        host=settings.api_host,
        port=settings.api_port,
        forwarded_allow_ips=settings.forwarded_allow_ips,
        # What the process itself bounds against slow or idle clients (the rest, e.g. a header
        # read timeout, is the reverse proxy's: docs/operator-guide.md, "Behind a reverse proxy").
        limit_concurrency=settings.api_max_concurrency,
        timeout_keep_alive=settings.api_keepalive_seconds,
        h11_max_incomplete_event_size=MAX_HEADER_BYTES,
        http=CuttableH11Protocol,  # a stalled live client can be cut (api.live.connection_cut)
        # BACKFILL_LOG_LEVEL (configured on the root logger by the CLI) for uvicorn's loggers too.
        log_level=logging.getLogger().getEffectiveLevel(),
        access_log=False,
        log_config=None,  # uvicorn's lines go through the root handler: text or JSON alike
    )


def run(settings: Settings) -> None:
    check_exposure(settings)
    warn_missing_upstream_keys(settings)  # the live proxy sends the routes' keys too
    tracing.setup("backfill-api")  # off unless OTEL_* asks (docs/operator-guide.md)
    if settings.api_metrics_port is not None:
        metrics, _ = start_http_server(settings.api_metrics_port, settings.api_metrics_host)
        log.info("api /metrics on %s:%s", settings.api_metrics_host, metrics.server_port)
    server = uvicorn.Server(server_config(settings, create_app(settings)))
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    if not server.started:
        raise SystemExit(3)  # as uvicorn.run: could not start (e.g. the port is taken)
