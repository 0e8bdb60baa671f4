"""The web console under `/console` (docs/console.md): server-rendered pages over the JSON API's
own functions, signed in with an API key, with static files served from this package."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

# Importing the page modules registers their routes on `router`.
from api.console import (
    batch_pages,
    job_pages,
    route_pages,
    signin,
    usage_page,
    webhooks_page,
)
from api.console.fallback import no_such_page
from api.console.web import STATIC_DIR, ConsoleState, router

__all__ = [
    "install",
    "batch_pages",
    "job_pages",
    "route_pages",
    "signin",
    "usage_page",
    "webhooks_page",
]


def install(app: FastAPI) -> None:
    """Serve the console's pages and static files on `app`."""
    app.state.console = ConsoleState()
    # The static files and every page before the catch-all 404 page, which would shadow them.
    app.mount("/console/static", StaticFiles(directory=STATIC_DIR), name="console-static")
    app.include_router(router)
    app.add_api_route(
        "/console/{rest:path}", no_such_page, methods=["GET"], include_in_schema=False
    )
