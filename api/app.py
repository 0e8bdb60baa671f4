"""The FastAPI app: OpenAI Files and Batches APIs, health and metrics."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import httpx
from fastapi import FastAPI
from temporalio.client import Client

from api import admin, batches, errors, files, health
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
    app.include_router(files.router)
    app.include_router(batches.router)
    app.include_router(health.router)
    app.include_router(admin.router)
    return app
