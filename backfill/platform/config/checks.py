"""Checks at start: the shipped dev keys only on a loopback development stack, and a warning per
route whose upstream key variable is unset."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from backfill.platform.config.dev import LOOPBACK_HOSTS
from backfill.platform.config.settings import Settings


def missing_upstream_keys(settings: Settings, environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """(route id, variable name) of every route whose `api_key_env` names a variable that is
    unset or empty in `environ`: its lines would go out without a key (and likely get 401)."""
    return [
        (route.id, route.api_key_env)
        for model in settings.models
        for route in model.routes
        if route.api_key_env and not environ.get(route.api_key_env)
    ]


def warn_missing_upstream_keys(settings: Settings) -> None:
    """Log a warning per route whose upstream key variable is unset (at api and worker start).
    Only the variable's name is logged, never a value."""
    for route_id, name in missing_upstream_keys(settings, os.environ):
        logging.getLogger(__name__).warning(
            "route %r: api_key_env names %s, which is not set: its requests go out without "
            "an Authorization header",
            route_id,
            name,
        )


class UnsafeConfig(Exception):
    """The settings are not safe for where the api would listen."""


def check_exposure(settings: Settings) -> None:
    """Refuse the shipped dev keys unless the stack says it is a development stack
    (`BACKFILL_DEV_STACK`, set by `backfill dev`) and listens on loopback: they are in a
    public repository. The host alone is not enough: an api on loopback behind a proxy on the
    same host serves whoever reaches the proxy."""
    dev = settings.shipped_dev_keys()
    if not dev:
        return
    keys = (
        f"the shipped dev key (sk-backfill-dev or another key of the repository's "
        f"backfill.toml: {', '.join(dev)}) is configured"
    )
    if not settings.dev_stack:
        raise UnsafeConfig(
            f"{keys} and this is not a development stack; remove it from the config file "
            "(BACKFILL_CONFIG), or run `backfill dev` (BACKFILL_DEV_STACK=1) for development"
        )
    if settings.api_host not in LOOPBACK_HOSTS:
        raise UnsafeConfig(
            f"{keys} and the api would listen on {settings.api_host}; a development stack "
            "listens on 127.0.0.1"
        )
