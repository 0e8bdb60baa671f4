"""`backfill api`: serve the app with uvicorn."""

from __future__ import annotations

import logging

import uvicorn

from api.app import create_app
from backfill.config import Settings, check_exposure, warn_missing_upstream_keys


def run(settings: Settings) -> None:
    check_exposure(settings)
    warn_missing_upstream_keys(settings)  # the live proxy sends the routes' keys too
    uvicorn.run(
        create_app(settings),
        host=settings.api_host,
        port=settings.api_port,
        # BACKFILL_LOG_LEVEL (configured on the root logger by the CLI) for uvicorn's loggers too.
        log_level=logging.getLogger().getEffectiveLevel(),
        access_log=False,
        log_config=None,  # uvicorn's lines go through the root handler: text or JSON alike
    )
