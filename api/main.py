"""`backfill api`: serve the app with uvicorn."""

from __future__ import annotations

import uvicorn

from api.app import create_app
from backfill.config import LOOPBACK_HOSTS, Settings


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
    uvicorn.run(
        create_app(settings),
        host=settings.api_host,
        port=settings.api_port,
        log_level="info",
        access_log=False,
    )
