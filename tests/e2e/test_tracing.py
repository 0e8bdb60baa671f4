"""OpenTelemetry traces of one batch line and one live request, collected in memory.

The spans must be read in this process (OpenTelemetry's InMemorySpanExporter), so the api and
the worker run here rather than as child processes: the real app (`api.app.create_app`) served
by uvicorn on loopback, the real worker (`worker.main.running_worker`), one Temporal client with
`backfill.platform.tracing`'s interceptor, the session's dev server, the simulator as upstream and
the official `openai` SDK as the client, all over real HTTP and gRPC.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import pytest_asyncio
import uvicorn
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from api.app import create_app
from backfill.platform import tracing
from backfill.platform.config import ApiKeyConfig, Settings, hash_key
from backfill.platform.temporal_client import connect
from tests.polling import poll_until
from tools.dev.procs import free_port
from tools.sim import SimConfig, SimServer
from worker.main import running_worker

KEY = "sk-trace-alpha"
PROMPT = "the-prompt-text-never-in-a-span"

_exporter = InMemorySpanExporter()
_provider: TracerProvider | None = None


@pytest.fixture(scope="module")
def spans() -> Iterator[InMemorySpanExporter]:
    """This process's tracer provider, exporting to memory (OpenTelemetry installs one per
    process); tracing is turned off again after the module."""
    global _provider
    if _provider is None:
        _provider = tracing.traced_provider()
        _provider.add_span_processor(SimpleSpanProcessor(_exporter))
    tracing.install(_provider)
    _exporter.clear()
    yield _exporter
    tracing.turn_off()
    _exporter.clear()


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def traced(
    spans: InMemorySpanExporter, tmp_path_factory: pytest.TempPathFactory, dev_server: Any
) -> AsyncIterator[str]:
    """The traced stack; yields the api's base URL."""
    sim = SimServer(SimConfig(model_names=[], latency_ms=20))
    await sim.start()
    tmp: Path = tmp_path_factory.mktemp("tracing")
    suffix = uuid.uuid4().hex[:8]
    settings = Settings(
        data_dir=tmp / "data",
        temporal_address=dev_server.address,
        temporal_namespace=dev_server.namespace,
        task_queue=f"tq-trace-{suffix}",
        models=[
            {
                "id": "demo",
                "routes": [{"id": f"sim-{suffix}", "base_url": sim.base_url}],
            }
        ],
        api_keys=[ApiKeyConfig(sha256=hash_key(KEY), workspace=f"alpha-{suffix}", name="a")],
    )
    client = await connect(settings, interceptors=tracing.interceptors())
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(settings, client=client), port=port, log_level="warning")
    )
    task = asyncio.create_task(server.serve())
    try:
        async with running_worker(client, settings):
            await poll_until(lambda: server.started, bool, timeout=30, what="the api to start")
            yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
        await sim.stop()


def by_id(finished: tuple[ReadableSpan, ...]) -> dict[int, ReadableSpan]:
    return {s.context.span_id: s for s in finished}


def ancestry(span: ReadableSpan, spans: dict[int, ReadableSpan]) -> list[ReadableSpan]:
    """`span` and its parents up to the root of what was collected."""
    chain = [span]
    while chain[-1].parent is not None and chain[-1].parent.span_id in spans:
        chain.append(spans[chain[-1].parent.span_id])
    return chain


def assert_no_content(finished: tuple[ReadableSpan, ...]) -> None:
    """Identifiers only: no prompt, no key, in any attribute of any span."""
    for s in finished:
        text = json.dumps(dict(s.attributes or {}), default=str)
        assert PROMPT not in text and KEY not in text and hash_key(KEY) not in text, s.name


async def test_one_batch_line_is_one_trace_from_the_create_request_to_the_upstream_call(
    traced: str, spans: InMemorySpanExporter
) -> None:
    client = openai.AsyncOpenAI(api_key=KEY, base_url=f"{traced}/v1", max_retries=0)
    line = {
        "custom_id": "only",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "demo", "messages": [{"role": "user", "content": PROMPT}]},
    }
    f = await client.files.create(
        file=("in.jsonl", json.dumps(line).encode() + b"\n"), purpose="batch"
    )
    batch = await client.batches.create(
        input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    done = await poll_until(
        lambda: client.batches.retrieve(batch.id),
        lambda b: b.status in ("completed", "failed", "expired", "cancelled"),
        timeout=120,
        what="the traced batch to end",
    )
    assert done.status == "completed" and done.request_counts.completed == 1

    finished = spans.get_finished_spans()
    upstream = [
        s
        for s in finished
        if s.kind == SpanKind.CLIENT
        and (s.attributes or {}).get(tracing.BATCH_ID) == batch.id
        and s.name == "upstream POST /v1/chat/completions"
    ]
    assert len(upstream) == 1
    up = upstream[0]
    attrs = dict(up.attributes or {})
    assert attrs[tracing.LINE] == 0 and attrs["http.response.status_code"] == 200
    assert attrs[tracing.REQUEST_ID].startswith("req_") and attrs[tracing.WORKSPACE].startswith(
        "alpha-"
    )
    assert attrs[tracing.ROUTE].startswith("sim-")

    # The interceptor's workflow spans take the context the workflow was started with: the
    # activity's span is a child of StartWorkflow, beside the (zero-length) RunWorkflow span.
    chain = ancestry(up, by_id(finished))
    names = [s.name for s in chain]
    assert names == [
        "upstream POST /v1/chat/completions",
        "RunActivity:run_line",
        "StartActivity:run_line",
        "StartWorkflow:BatchWorkflow",
        "POST /v1/batches",
    ], names
    start = chain[3]
    assert (start.attributes or {})["temporalWorkflowID"] == batch.id
    runs = [
        s
        for s in finished
        if s.name == "RunWorkflow:BatchWorkflow"
        and s.parent is not None
        and s.parent.span_id == start.context.span_id
    ]
    assert len(runs) == 1 and (runs[0].attributes or {})["temporalWorkflowID"] == batch.id
    assert len({s.context.trace_id for s in chain}) == 1
    create = chain[-1]
    assert create.kind == SpanKind.SERVER and create.parent is None
    created = dict(create.attributes or {})
    assert created[tracing.BATCH_ID] == batch.id and created["http.route"] == "/v1/batches"
    assert created[tracing.WORKSPACE].startswith("alpha-")
    assert created["http.response.status_code"] == 200
    assert created[tracing.REQUEST_ID].startswith("req_")

    # The workflows' signals are in the trace too: the scheduler's and the batch's.
    in_trace = [s for s in finished if s.context.trace_id == create.context.trace_id]
    handled = {
        (s.name, str((s.attributes or {}).get("temporalWorkflowID", "")).startswith("batch_"))
        for s in in_trace
        if s.name.startswith("HandleSignal:")
    }
    assert any(batch_side for _, batch_side in handled), handled
    assert any(not batch_side for _, batch_side in handled), handled
    # Reads of the batch are traced as requests of their own, with its id.
    reads = [s for s in finished if s.name == "GET /v1/batches/{batch_id}"]
    assert reads and all((s.attributes or {})[tracing.BATCH_ID] == batch.id for s in reads)
    assert_no_content(finished)

    # The batch's end announces its webhook event; the workspace has no endpoint, a normal
    # absence: no span of that trace is an ERROR (a query of the endpoints workflow that does
    # not exist was one).
    announced = await poll_until(
        lambda: [
            s for s in spans.get_finished_spans() if s.name == "RunActivity:announce_webhook_event"
        ],
        timeout=60,
        what="the batch's end to announce its webhook event",
    )
    ending = {s.context.trace_id for s in announced}
    errors = [
        s.name
        for s in spans.get_finished_spans()
        if s.context.trace_id in ending and s.status.status_code == StatusCode.ERROR
    ]
    assert errors == [], errors


async def test_a_live_request_is_traced_to_its_upstream_call(
    traced: str, spans: InMemorySpanExporter
) -> None:
    client = openai.AsyncOpenAI(api_key=KEY, base_url=f"{traced}/v1", max_retries=0)
    answer = await client.chat.completions.create(
        model="demo", messages=[{"role": "user", "content": PROMPT}]
    )
    assert answer.choices
    # The server span ends once the last byte is sent: just after the client has the answer.
    finished = await poll_until(
        spans.get_finished_spans,
        lambda done: any(s.name == "POST /v1/chat/completions" for s in done),
        timeout=10,
        what="the live request's server span to end",
    )
    server = [s for s in finished if s.name == "POST /v1/chat/completions"]
    assert len(server) == 1
    children = [
        s
        for s in finished
        if s.parent is not None and s.parent.span_id == server[0].context.span_id
    ]
    assert [s.name for s in children] == ["upstream POST /v1/chat/completions"]
    attrs = dict(children[0].attributes or {})
    assert attrs["http.response.status_code"] == 200 and attrs[tracing.ROUTE].startswith("sim-")
    assert attrs[tracing.REQUEST_ID] == dict(server[0].attributes or {})[tracing.REQUEST_ID]
    assert_no_content(finished)
