"""`backfill api`: serve the app with uvicorn."""

from __future__ import annotations

import logging

import uvicorn

from api.app import create_app
from backfill.config import LOOPBACK_HOSTS, Settings, warn_missing_upstream_keys


class UnsafeConfig(Exception):
    """The settings are not safe for where the api would listen."""


def check_exposure(settings: Settings) -> None:
    """Refuse the shipped dev keys anywhere but loopback: they are in a public repository."""
    dev = settings.shipped_dev_keys()
    if dev and settings.api_host not in LOOPBACK_HOSTS:
        raise UnsafeConfig(
            f"the api would listen on {settings.api_host} with the shipped dev key "
            f"(sk-backfill-dev or another key of the repository's backfill.toml: "
            f"{', '.join(dev)}) configured; remove it from the config "
            "file (BACKFILL_CONFIG) or listen on 127.0.0.1"
        )


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
