"""A server span for every api request, when tracing is on (`backfill.platform.tracing`).

A pure ASGI middleware inside `RequestIdMiddleware`: the span continues a caller's W3C
`traceparent`, is named after the matched route (`POST /v1/batches`,
`GET /gateway/v1/batches/{job_id}`), and carries the request id, the route, the status and the
ids in the path (`backfill.batch_id`, `backfill.job_id`, `backfill.file_id`); the key's
workspace is added where the key is checked (`api.deps`), a new batch's id where it is created.
Never a header's value, a query string or a body. `/metrics`, `/healthz` and the console's
static files are not traced.
"""

from __future__ import annotations

from opentelemetry import propagate, trace
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from backfill.platform import tracing

UNTRACED = ("/metrics", "/healthz", "/readyz", "/console/static/")
PATH_IDS = {"batch_id": tracing.BATCH_ID, "job_id": tracing.JOB_ID, "file_id": tracing.FILE_ID}


class RequestSpans:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope.get("path", "")
        if scope["type"] != "http" or not tracing.on() or path.startswith(UNTRACED):
            await self.app(scope, receive, send)
            return
        method: str = scope["method"]
        carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        rid = scope.get("state", {}).get("request_id")
        with tracing.tracer().start_as_current_span(
            method,
            context=propagate.extract(carrier),
            kind=trace.SpanKind.SERVER,
            attributes={"http.request.method": method, tracing.REQUEST_ID: rid or ""},
        ) as span:

            async def send_traced(message: Message) -> None:
                if message["type"] == "http.response.start":
                    status = int(message["status"])
                    span.set_attribute("http.response.status_code", status)
                    if status >= 500:
                        span.set_status(trace.Status(trace.StatusCode.ERROR))
                await send(message)

            try:
                await self.app(scope, receive, send_traced)
            finally:
                route = getattr(scope.get("route"), "path", None)
                if route:
                    span.update_name(f"{method} {route}")
                    span.set_attribute("http.route", route)
                for param, attribute in PATH_IDS.items():
                    value = scope.get("path_params", {}).get(param)
                    if isinstance(value, str):
                        span.set_attribute(attribute, value)
