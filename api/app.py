"""The FastAPI app: OpenAI Files and Batches APIs, health and metrics."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

import httpx
from fastapi import FastAPI
from temporalio.client import Client

from api import admin, batches, errors, files, health
from api.middleware import UPLOAD_FORM_OVERHEAD, BodyLimit, BodyRule, CatchAll
from backfill.config import Settings
from backfill.store import FileStore
from backfill.temporal_client import connect


def create_app(settings: Settings, client: Client | None = None) -> FastAPI:
    """Build the app; it connects to Temporal in its lifespan unless a client is given."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.settings = settings
        app.state.store = FileStore(settings.data_dir)
        app.state.client = client or await connect(settings)
        async with httpx.AsyncClient(trust_env=False, follow_redirects=False) as http:
            app.state.http = http
            yield

    app = FastAPI(title="backfill", lifespan=lifespan)
    errors.install(app)
    app.add_middleware(CatchAll)
    app.add_middleware(BodyLimit, rule_for=body_rules(settings))  # outermost: before all
    app.include_router(files.router)
    app.include_router(batches.router)
    app.include_router(health.router)
    app.include_router(admin.router)
    return app


LIVE_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/embeddings"})


def body_rules(settings: Settings) -> Callable[[str, str], BodyRule]:
    """The rule for the request body at (method, path)."""
    limits = settings.limits
    upload = BodyRule(
        max_bytes=limits.max_file_bytes + UPLOAD_FORM_OVERHEAD,
        streamed=True,
        code="file_too_large",
        param="file",
        message=f"File is too large: the limit is {limits.max_file_bytes} bytes.",
    )
    live = BodyRule(max(limits.max_request_bytes, limits.max_line_bytes))
    other = BodyRule(limits.max_request_bytes)

    def rule_for(method: str, path: str) -> BodyRule:
        if path.rstrip("/") == "/v1/files":
            return upload
        if path in LIVE_PATHS:
            return live
        return other

    return rule_for
