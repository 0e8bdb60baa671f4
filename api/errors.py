"""API errors, all in OpenAI's envelope: {"error": {"message", "type", "param", "code"}}.

Raised by type anywhere in the api; mapped to responses in one place (`install`)."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from temporalio.client import RPCTimeoutOrCancelledError
from temporalio.service import RPCError, RPCStatusCode

from api.schemas import ErrorDetail, ErrorResponse
from backfill.batches import search_attributes as sa

log = logging.getLogger(__name__)

NOT_JSON = (
    "We could not parse the JSON body of your request. The API expects a JSON payload, but what "
    "was sent was not valid JSON."
)
NOT_AN_OBJECT = "The request body must be a JSON object."


class APIError(Exception):
    status = 400
    type = "invalid_request_error"

    headers: Mapping[str, str] | None = None
    """Response headers the error sets (`Retry-After` on a 503 that says when to come back)."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict[str, object]:
        detail = ErrorDetail(message=self.message, type=self.type, param=self.param, code=self.code)
        return ErrorResponse(error=detail).model_dump(mode="json")


class InvalidRequest(APIError):
    status = 400


class Unauthorized(APIError):
    status = 401
    type = "invalid_request_error"


class Forbidden(APIError):
    status = 403
    type = "permission_error"


class NotFound(APIError):
    status = 404


class Conflict(APIError):
    status = 409


class PayloadTooLarge(APIError):
    status = 413


class TooManyRequests(APIError):
    """A workspace limit (active batches, stored bytes) is reached."""

    status = 429
    type = "rate_limit_error"


class Unavailable(APIError):
    status = 503
    type = "server_error"


class RetryLater(Unavailable):
    """A 503 that tells the client when to try again (`Retry-After`, whole seconds)."""

    def __init__(self, message: str, *, retry_after: int, code: str) -> None:
        super().__init__(message, code=code)
        self.headers = {"Retry-After": str(retry_after)}


def invalid_request(error: Mapping[str, Any]) -> InvalidRequest:
    """A 400 in OpenAI's shape for one pydantic/FastAPI validation error.

    `param` is the top-level parameter at fault (`metadata` for a bad `metadata.k` value), the
    message names the full path. A body that is not JSON, or JSON but not an object, has no param.
    """
    loc = tuple(error.get("loc", ()))
    kind = error.get("type")
    if kind == "json_invalid":
        return InvalidRequest(NOT_JSON)
    source, path = (loc[0], loc[1:]) if loc and loc[0] in ("body", "query", "path") else (None, loc)
    if not path:
        if source == "body":
            return InvalidRequest(NOT_AN_OBJECT)
        return InvalidRequest(str(error.get("msg", "Invalid request.")))
    param = str(path[0])
    if kind == "missing" and len(path) == 1:
        return InvalidRequest(f"Missing required parameter: '{param}'.", param=param)
    where = ".".join(str(p) for p in path)
    return InvalidRequest(f"Invalid value for '{where}': {error.get('msg')}.", param=param)


class TemporalUnavailable(Unavailable):
    """Temporal cannot be reached now (not connected yet, stopped, or too slow): 503."""

    def __init__(self, detail: str = "") -> None:
        message = "The batch service is temporarily unavailable (Temporal is not answering)."
        super().__init__(f"{message} {detail}".strip(), code="temporal_unavailable")


class SearchAttributeMissing(Unavailable):
    """The namespace lacks a search attribute backfill writes: 503 until an operator adds it."""

    def __init__(self, name: str) -> None:
        kind = sa.ALL.get(name, "Keyword")
        super().__init__(
            f"The batch service cannot record this batch: the Temporal namespace has no search "
            f"attribute '{name}'. An operator adds it with `temporal operator search-attribute "
            f"create --name {name} --type {kind}`; `backfill doctor` checks them all.",
            code="search_attribute_missing",
        )


_UNREGISTERED = (
    re.compile(r"no mapping defined for search attribute (\w+)"),  # the dev server
    re.compile(r"search attribute (\w+) is not defined"),
)


def unregistered_search_attribute(err: RPCError) -> str | None:
    """The name of the search attribute Temporal refused as not registered, if that is the
    error (INVALID_ARGUMENT; e.g. "Namespace default has no mapping defined for search attribute
    BackfillRetryOf" from the dev server)."""
    if err.status != RPCStatusCode.INVALID_ARGUMENT:
        return None
    for pattern in _UNREGISTERED:
        found = pattern.search(err.message)
        if found:
            return found.group(1)
    return None


TEMPORAL_TRANSIENT = frozenset(
    {
        RPCStatusCode.UNAVAILABLE,
        RPCStatusCode.DEADLINE_EXCEEDED,
        RPCStatusCode.CANCELLED,  # what the SDK raises when an RPC's own deadline expires
        RPCStatusCode.RESOURCE_EXHAUSTED,
    }
)
"""RPC errors that mean "Temporal is not answering now" (503), not "this request is wrong"."""


def _response(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def install(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return _response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        return _response(invalid_request(errors[0] if errors else {}))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        cls: type[APIError] = {404: NotFound, 405: InvalidRequest}.get(exc.status_code, APIError)
        err = cls(str(exc.detail))
        err.status = exc.status_code
        return _response(err)

    @app.exception_handler(RPCError)
    async def _temporal_rpc(request: Request, exc: RPCError) -> JSONResponse:
        missing = unregistered_search_attribute(exc)
        if missing is not None:
            log.error("search attribute %s is not registered on the namespace", missing)
            return _response(SearchAttributeMissing(missing))
        if exc.status not in TEMPORAL_TRANSIENT:
            return await _unexpected(request, exc)
        log.warning("Temporal unavailable on %s %s: %s", request.method, request.url.path, exc)
        return _response(TemporalUnavailable())

    @app.exception_handler(RPCTimeoutOrCancelledError)
    async def _temporal_timeout(request: Request, exc: RPCTimeoutOrCancelledError) -> JSONResponse:
        log.warning("Temporal timed out on %s %s: %s", request.method, request.url.path, exc)
        return _response(TemporalUnavailable())

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        err = APIError("The server had an error processing your request.")
        err.status, err.type = 500, "server_error"
        return _response(err)
