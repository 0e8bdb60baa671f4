"""OpenTelemetry traces: off unless the standard `OTEL_*` variables ask for them.

On, every api request (files, batches, jobs, the live proxy, ...) is a server span; Temporal's
`TracingInterceptor` (on the api's and the worker's clients) carries its context into the
workflow it starts or signals, the workflow's activities and the signals they send; and each
request to a model server is a client span, whose context goes upstream in `traceparent` (a
vLLM started with `--otlp-traces-endpoint` joins the trace). So one batch line reads as
`POST /v1/batches` → `StartWorkflow:BatchWorkflow` → `RunWorkflow:BatchWorkflow` →
`StartActivity:run_line` → `RunActivity:run_line` → `upstream POST /v1/chat/completions`.

Attributes are identifiers only (`backfill.request_id`, `backfill.batch_id`, `backfill.line`,
`backfill.route`, `backfill.workspace`, the HTTP route and status): never a prompt, an answer,
a header's value or a key. Entry points call `setup`; the rest asks `on()`. Workflow code never
touches this module: the interceptor creates the workflows' spans, replay-safe.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.util.types import Attributes

log = logging.getLogger(__name__)

TRACER = "backfill"
REQUEST_ID = "backfill.request_id"
BATCH_ID = "backfill.batch_id"
JOB_ID = "backfill.job_id"
FILE_ID = "backfill.file_id"
LINE = "backfill.line"
ROUTE = "backfill.route"
WORKSPACE = "backfill.workspace"
EXPORTERS = ("otlp", "console")
"""The span exporters `OTEL_TRACES_EXPORTER` may name (comma-separated; `none`: off)."""

_on = False


def exporters_from_env(env: Mapping[str, str]) -> list[str]:
    """The span exporters the standard variables ask for; empty means tracing is off.

    `OTEL_SDK_DISABLED=true` turns it off; `OTEL_TRACES_EXPORTER` names exporters (`otlp`,
    `console`, `none`); without it, an OTLP endpoint (`OTEL_EXPORTER_OTLP_ENDPOINT` or
    `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) means `otlp`. Nothing set: off (the SDK's own default
    would send OTLP to localhost; backfill sends nothing unless told). An unknown name is a
    `ValueError` naming the variable."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    named = [e.strip().lower() for e in env.get("OTEL_TRACES_EXPORTER", "").split(",")]
    named = [e for e in named if e]
    if named:
        unknown = [e for e in named if e not in (*EXPORTERS, "none")]
        if unknown:
            raise ValueError(
                f"OTEL_TRACES_EXPORTER: unknown exporter {unknown[0]!r} "
                f"(backfill sends traces with {', '.join(EXPORTERS)} or none)"
            )
        return [e for e in named if e != "none"]
    if env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return ["otlp"]
    return []


def _exporter(name: str) -> SpanExporter:
    if name == "console":
        return ConsoleSpanExporter()
    # OTLP over HTTP/protobuf; endpoint, headers, timeout, ... from OTEL_EXPORTER_OTLP_*.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def setup(service: str, env: Mapping[str, str] | None = None) -> TracerProvider | None:
    """Tracing for this process (`service`: `backfill-api`, `backfill-worker`) as the `OTEL_*`
    variables say, or None when they leave it off. `OTEL_SERVICE_NAME` and
    `OTEL_RESOURCE_ATTRIBUTES` override the name; `OTEL_TRACES_SAMPLER` picks the sampler."""
    env = os.environ if env is None else env
    names = exporters_from_env(env)
    if not names:
        return None
    attributes = {} if env.get("OTEL_SERVICE_NAME") else {"service.name": service}
    provider = traced_provider(Resource.create(attributes))
    for name in names:
        provider.add_span_processor(BatchSpanProcessor(_exporter(name)))
    install(provider)
    log.info("tracing on: spans of %s go to %s", service, ", ".join(names))
    return provider


class RequestRooted(Sampler):
    """`inner` (the sampler `OTEL_TRACES_SAMPLER` picks), except that a Temporal client call
    made outside any span is not traced: the api's and the worker's background loops (live
    counts, the console's chart, the metrics exporter) query and signal every few seconds, and
    each would be a one-span trace of its own. Traces start at an api request (or a caller's
    `traceparent`)."""

    def __init__(self, inner: Sampler) -> None:
        self.inner = inner

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: trace.SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[trace.Link] | None = None,
        trace_state: trace.TraceState | None = None,
    ) -> SamplingResult:
        parent = trace.get_current_span(parent_context).get_span_context()
        if not parent.is_valid and kind == trace.SpanKind.CLIENT:
            return SamplingResult(Decision.DROP)
        return self.inner.should_sample(
            parent_context, trace_id, name, kind, attributes, links, trace_state
        )

    def get_description(self) -> str:
        return f"RequestRooted{{{self.inner.get_description()}}}"


def traced_provider(resource: Resource | None = None) -> TracerProvider:
    """A tracer provider with `RequestRooted` around the sampler the environment picks."""
    inner = TracerProvider(shutdown_on_exit=False).sampler  # OTEL_TRACES_SAMPLER(_ARG)
    return TracerProvider(sampler=RequestRooted(inner), resource=resource)


def install(provider: trace.TracerProvider) -> None:
    """Make `provider` this process's (once per process: OpenTelemetry's rule) and turn tracing
    on. `setup` calls it; tests call it with an in-memory exporter's provider."""
    global _on
    if trace.get_tracer_provider() is not provider:
        trace.set_tracer_provider(provider)
    _on = True


def turn_off() -> None:
    """Stop tracing in this process (the provider stays: OpenTelemetry sets it once). Tests."""
    global _on
    _on = False


def on() -> bool:
    """Whether this process traces (its Temporal clients then get the interceptor)."""
    return _on


def interceptors() -> list[Any]:
    """Temporal's tracing interceptor for a client (its workers inherit it), when on."""
    if not _on:
        return []
    from temporalio.contrib.opentelemetry import TracingInterceptor

    return [TracingInterceptor()]


def workflow_runner() -> Any | None:
    """The workflow sandbox with `opentelemetry` passed through (as Temporal's samples do), so
    the interceptor's workflow side uses the process's modules; None (the default sandbox) when
    tracing is off."""
    if not _on:
        return None
    from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

    restrictions = SandboxRestrictions.default.with_passthrough_modules("opentelemetry")
    return SandboxedWorkflowRunner(restrictions=restrictions)


def tracer() -> trace.Tracer:
    return trace.get_tracer(TRACER)


def annotate(**attributes: str | int | None) -> None:
    """Set identifiers on the current span (`batch_id=...`, `workspace=...`; None skipped):
    a no-op when tracing is off or no span is current."""
    span = trace.get_current_span()
    if not span.is_recording():
        return
    for name, value in attributes.items():
        if value is not None:
            span.set_attribute(f"backfill.{name}", value)


@contextmanager
def upstream_span(path: str, route: str, request_id: str, **ids: str | int | None) -> Iterator[Any]:
    """A client span around one request to a model server (`path`: the endpoint's upstream
    path), with the route, the request id and `ids` (`batch_id`, `line`, `workspace`). Set its
    status with `answered`."""
    attributes: dict[str, Any] = {
        "http.request.method": "POST",
        "url.path": path,
        ROUTE: route,
        REQUEST_ID: request_id,
    }
    attributes.update({f"backfill.{k}": v for k, v in ids.items() if v is not None})
    with tracer().start_as_current_span(
        f"upstream POST {path}", kind=trace.SpanKind.CLIENT, attributes=attributes
    ) as span:
        yield span


def answered(span: Any, status_code: int | None, error_code: str | None = None) -> None:
    """Record the upstream's HTTP status (an error status marks the span failed), or the error
    code when nothing answered."""
    if not span.is_recording():
        return
    if status_code:
        span.set_attribute("http.response.status_code", status_code)
    if error_code:
        span.set_attribute("error.type", error_code)
    if (status_code or 0) >= 500 or (error_code and not status_code):
        span.set_status(trace.Status(trace.StatusCode.ERROR))


def inject(headers: Any) -> None:
    """The current span's context into outgoing `headers` (W3C `traceparent`); nothing when no
    span is recording."""
    if trace.get_current_span().is_recording():
        propagate.inject(headers)
