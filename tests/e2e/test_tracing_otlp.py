"""Traces as an operator turns them on: the api and worker processes of the real stack, started
with nothing but `OTEL_EXPORTER_OTLP_ENDPOINT`, send their spans over OTLP/HTTP to a collector
(here a small OTLP receiver on loopback that decodes what it is sent), and one batch line is one
trace across both processes (docs/operator-guide.md, "Traces")."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.e2e.stack import Stack, submit, wait_terminal
from tests.polling import poll_until
from tools.sim import SimConfig


class Collector:
    """An OTLP/HTTP trace receiver: every span it was sent, with its service's name."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, Any]] = []
        self.lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802  # http.server's name
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                request = ExportTraceServiceRequest.FromString(body)
                with collector.lock:
                    for resource in request.resource_spans:
                        attrs = {a.key: a.value.string_value for a in resource.resource.attributes}
                        for scope in resource.scope_spans:
                            collector.spans += [(attrs["service.name"], s) for s in scope.spans]
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def named(self, name: str) -> list[tuple[str, Any]]:
        with self.lock:
            return [(service, s) for service, s in self.spans if s.name == name]


@pytest.fixture
def collector() -> Iterator[Collector]:
    c = Collector()
    c.thread.start()
    try:
        yield c
    finally:
        c.server.shutdown()
        c.server.server_close()


async def test_processes_send_one_trace_per_line_to_an_otlp_collector(
    tmp_path: Any, dev_server: Any, collector: Collector
) -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.url, "OTEL_BSP_SCHEDULE_DELAY": "200"}
    stack = Stack(
        tmp_path, dev_server.address, sim=SimConfig(model_names=[], latency_ms=5), extra_env=env
    )
    async with stack.running():
        batch_id = await submit(stack, 1)
        done = await wait_terminal(stack.client(), batch_id, within=120)
        assert done.status == "completed"

        def line_span() -> list[tuple[str, Any]]:
            return collector.named("upstream POST /v1/chat/completions")

        [(service, upstream)] = await poll_until(
            line_span, bool, timeout=30, what="the line's upstream span at the collector"
        )
        assert service == "backfill-worker"
        creates = await poll_until(
            lambda: collector.named("POST /v1/batches"),
            bool,
            timeout=30,
            what="the create request's span at the collector",
        )
        [(api_service, create)] = creates
        assert api_service == "backfill-api"
        assert upstream.trace_id == create.trace_id  # one trace, across both processes
        ids = {a.key: a.value for a in upstream.attributes}
        assert ids["backfill.batch_id"].string_value == batch_id
        assert ids["backfill.line"].int_value == 0
