"""Any other `/console/...` page: a 404 page, not the JSON API's envelope. `install` adds it to
the app after every real page, so those are matched first."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import Response

from api.console.web import error_page
from api.errors import NotFound


async def no_such_page(request: Request, rest: str) -> Response:
    return error_page(request, NotFound(f"No such console page: /console/{rest}"))
