"""What every console page shares: the router, templates, the session dependency, CSRF checks
and the mapping of the JSON API's errors to HTML pages.

The console calls the JSON API's own functions (api/batches/batches_api.py,
api/routes/routes_api.py, ...), which raise `APIError`s by type; `ConsoleRoute` renders those as an
error page with the same status, so the server enforces every role exactly as the API does.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.routing import APIRoute
from fastapi.templating import Jinja2Templates
from starlette.datastructures import FormData
from temporalio.client import RPCTimeoutOrCancelledError
from temporalio.service import RPCError

from api.console.samples import RouteSamples
from api.console.sessions import Session, SessionTable
from api.errors import (
    TEMPORAL_TRANSIENT,
    APIError,
    Forbidden,
    TemporalUnavailable,
    invalid_request,
)

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
templates = Jinja2Templates(directory=HERE / "templates")
STATIC_DIR = HERE / "static"

SESSION_COOKIE = "backfill_console"
SIGNIN_COOKIE = "backfill_console_signin"
"""Sign-in's own CSRF token (double submit): there is no session yet to hold one."""
COOKIE_PATH = "/console"


class SignInRequired(Exception):
    """No live session: pages redirect to the sign-in form."""


class ConsoleRoute(APIRoute):
    """Errors become HTML: sign-in redirects, and API errors as a page with their status."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except SignInRequired:
                return RedirectResponse("/console/sign-in", status_code=303)
            except APIError as err:
                return error_page(request, err)
            except RequestValidationError as exc:
                errors = exc.errors()
                return error_page(request, invalid_request(errors[0] if errors else {}))
            except RPCTimeoutOrCancelledError:
                return error_page(request, TemporalUnavailable())
            except RPCError as err:
                if err.status not in TEMPORAL_TRANSIENT:
                    raise
                return error_page(request, TemporalUnavailable())

        return route


router = APIRouter(prefix="/console", include_in_schema=False, route_class=ConsoleRoute)


def state(request: Request) -> ConsoleState:
    return request.app.state.console  # type: ignore[no-any-return]


class ConsoleState:
    """The api process's console state: sessions and the route chart's samples."""

    def __init__(self) -> None:
        self.sessions = SessionTable()
        self.samples = RouteSamples()


def current_session(request: Request) -> Session | None:
    return state(request).sessions.get(request.cookies.get(SESSION_COOKIE), time.time())


def require_session(request: Request) -> Session:
    session = current_session(request)
    if session is None:
        raise SignInRequired()
    return session


SessionDep = Annotated[Session, Depends(require_session)]


async def checked_form(request: Request, session: Session) -> FormData:
    """The posted form, once its CSRF token matches the session's (403 otherwise)."""
    form = await request.form()
    token = form.get("csrf_token")
    if not session.csrf_ok(token if isinstance(token, str) else None):
        log.warning("console: form without a valid CSRF token on %s", request.url.path)
        raise Forbidden("The form's CSRF token is missing or wrong: reload the page.")
    return form


def render(
    request: Request,
    name: str,
    session: Session | None,
    status_code: int = 200,
    **context: Any,
) -> HTMLResponse:
    return templates.TemplateResponse(
        request,
        name,
        {"session": session, "identity": session.identity if session else None, **context},
        status_code=status_code,
        headers=SECURITY_HEADERS,
    )


def error_page(request: Request, err: APIError) -> HTMLResponse:
    return render(request, "error.html", current_session(request), err.status, error=err)


SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
        "frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def when(ts: int | float | None) -> str:
    """A Unix time as `2026-11-30 19:30:05 UTC` (empty for None)."""
    if ts is None:
        return ""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def duration(seconds: float) -> str:
    """`2d 3h`, `5h 12m`, `4m 10s`, `12s`."""
    s = int(max(seconds, 0))
    d, rest = divmod(s, 86400)
    h, rest = divmod(rest, 3600)
    m, sec = divmod(rest, 60)
    if d:
        return f"{d}d {h}h"
    if h:
        return f"{h}h {m}m"
    if m:
        return f"{m}m {sec}s"
    return f"{sec}s"


templates.env.filters["when"] = when
templates.env.filters["duration"] = duration
