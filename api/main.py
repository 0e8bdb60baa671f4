"""`backfill api`: serve the app with uvicorn."""

from __future__ import annotations

import uvicorn

from api.app import create_app
from backfill.config import Settings


def run(settings: Settings) -> None:
    uvicorn.run(
        create_app(settings),
        host=settings.api_host,
        port=settings.api_port,
        log_level="info",
        access_log=False,
    )
