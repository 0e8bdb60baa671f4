"""Tracing's switches without a server: which `OTEL_*` settings turn it on, the sampler that
keeps background Temporal calls out of traces, and the api's request spans (identifiers only)."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, Decision

from backfill.platform import tracing


@pytest.mark.parametrize(
    ("env", "exporters"),
    [
        ({}, []),  # off by default, whatever the SDK's own default would send
        ({"OTEL_SERVICE_NAME": "x"}, []),
        ({"OTEL_TRACES_EXPORTER": "console"}, ["console"]),
        ({"OTEL_TRACES_EXPORTER": "otlp,console"}, ["otlp", "console"]),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, []),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, ["otlp"]),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, ["otlp"]),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "console"}, []),
    ],
)
def test_the_standard_variables_turn_tracing_on(env: dict[str, str], exporters: list[str]) -> None:
    assert tracing.exporters_from_env(env) == exporters


def test_an_unknown_exporter_names_the_variable() -> None:
    with pytest.raises(ValueError, match="OTEL_TRACES_EXPORTER.*zipkin"):
        tracing.exporters_from_env({"OTEL_TRACES_EXPORTER": "zipkin"})


def test_setup_leaves_tracing_off_without_the_variables() -> None:
    assert tracing.setup("backfill-test", env={}) is None


def test_background_client_calls_start_no_trace() -> None:
    sampler = tracing.RequestRooted(ALWAYS_ON)
    root_client = sampler.should_sample(None, 1, "QueryWorkflow:status", trace.SpanKind.CLIENT)
    assert root_client.decision == Decision.DROP
    root_server = sampler.should_sample(None, 1, "POST /v1/batches", trace.SpanKind.SERVER)
    assert root_server.decision == Decision.RECORD_AND_SAMPLE
    parent = trace.set_span_in_context(
        trace.NonRecordingSpan(
            trace.SpanContext(1, 2, is_remote=False, trace_flags=trace.TraceFlags(1))
        )
    )
    child = sampler.should_sample(parent, 1, "StartWorkflow:BatchWorkflow", trace.SpanKind.CLIENT)
    assert child.decision == Decision.RECORD_AND_SAMPLE


def test_upstream_span_records_identifiers_and_the_status(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "tracer", lambda: provider.get_tracer("t"))
    headers: dict[str, str] = {}
    with tracing.upstream_span("/v1/embeddings", "r1", "req_1", batch_id="b", line=3) as span:
        tracing.inject(headers)
        tracing.answered(span, 503)
    with tracing.upstream_span("/v1/embeddings", "r1", "req_2", workspace=None) as span:
        tracing.answered(span, None, "connection_error")
    first, second = exporter.get_finished_spans()
    assert first.name == "upstream POST /v1/embeddings" and first.kind == trace.SpanKind.CLIENT
    assert dict(first.attributes or {}) == {
        "http.request.method": "POST",
        "url.path": "/v1/embeddings",
        "backfill.route": "r1",
        "backfill.request_id": "req_1",
        "backfill.batch_id": "b",
        "backfill.line": 3,
        "http.response.status_code": 503,
    }
    assert first.status.status_code == trace.StatusCode.ERROR
    # The upstream request carries this span as its parent (W3C traceparent).
    assert headers["traceparent"].split("-")[2] == f"{first.context.span_id:016x}"
    assert "backfill.workspace" not in (second.attributes or {})
    assert (second.attributes or {})["error.type"] == "connection_error"
    no_span: dict[str, str] = {}
    tracing.inject(no_span)  # nothing current: nothing sent
    assert no_span == {}
