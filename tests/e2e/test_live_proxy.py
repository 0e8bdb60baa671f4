"""The live proxy over real HTTP: the `openai` SDK against the api, the simulator as upstream.

Streaming is relayed as it arrives, errors come back in OpenAI's envelope, live requests carry
no batch header and no priority, and every request is counted in flight until it ends."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import openai
import pytest
import pytest_asyncio

from tests.conftest import TemporalServer
from tests.e2e.stack import API_KEY, Stack, assert_error, auth
from tests.e2e.stack import live_in_flight as in_flight
from tools.sim import SimConfig, SimFault

UPSTREAM_KEY = "sk-upstream-route-key"
TOKEN_DELAY_MS = 60
MSG = [{"role": "user", "content": "one two three four five six seven eight"}]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def live(
    tmp_path_factory: pytest.TempPathFactory, dev_server: TemporalServer
) -> AsyncIterator[Stack]:
    sim = SimConfig(model_names=[], latency_ms=5, stream_token_delay_ms=TOKEN_DELAY_MS)
    tmp = tmp_path_factory.mktemp("live")
    s = Stack(tmp, dev_server.address, sim=sim, upstream_key=UPSTREAM_KEY)
    async with s.running():
        yield s


async def wait_in_flight(stack: Stack, value: float, within: float = 10) -> None:
    deadline = time.monotonic() + within
    while (seen := await in_flight(stack)) != value:
        assert time.monotonic() < deadline, f"in flight stays {seen}, expected {value}"
        await asyncio.sleep(0.05)


async def test_sdk_non_streaming_chat_completions_embeddings_models(live: Stack) -> None:
    oa = live.client()
    chat = await oa.chat.completions.create(model="demo", messages=MSG)  # type: ignore[arg-type]
    assert chat.choices[0].message.content.startswith("Simulated one two")  # type: ignore[union-attr]
    assert chat.usage is not None and chat.usage.completion_tokens > 0
    comp = await oa.completions.create(model="demo", prompt="hi there", max_tokens=1)
    assert comp.choices[0].text == "Simulated" and comp.choices[0].finish_reason == "length"
    emb = await oa.embeddings.create(model="demo", input=["a", "b"])  # base64 by default
    assert [len(d.embedding) for d in emb.data] == [16, 16]
    models = await oa.models.list()
    assert [m.id for m in models.data] == ["demo"]
    assert (await oa.models.retrieve("demo")).id == "demo"
    with pytest.raises(openai.NotFoundError):
        await oa.models.retrieve("nope")
    assert await in_flight(live) == 0
    # What the model server saw: the route's key, never the client's; no batch header, no
    # priority; an X-Request-ID.
    seen = list(live.sim.app.seen)[-3:]
    assert [s.path for s in seen] == ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"]
    for s in seen:
        assert s.authorization == f"Bearer {UPSTREAM_KEY}"
        assert s.batch is None and not s.has_priority
        assert s.request_id and s.request_id.startswith("req_")


async def test_streaming_arrives_token_by_token(live: Stack) -> None:
    oa = live.client()
    loop = asyncio.get_running_loop()
    arrivals: list[float] = []
    text = ""
    stream = await oa.chat.completions.create(
        model="demo",
        messages=MSG,  # type: ignore[arg-type]
        stream=True,
        stream_options={"include_usage": True},
    )
    async for chunk in stream:
        arrivals.append(loop.time())
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
    assert text == "Simulated one two three four five six seven eight"
    # role, 9 words, finish, usage: 12 chunks, each produced TOKEN_DELAY_MS after the one
    # before. Buffering would deliver them together; relayed, the first arrives long before the
    # last is produced.
    assert len(arrivals) == 12
    spread = arrivals[-1] - arrivals[0]
    assert spread >= 0.8 * 11 * TOKEN_DELAY_MS / 1000, f"chunks arrived within {spread:.3f}s"
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]
    assert sum(g >= TOKEN_DELAY_MS / 2000 for g in gaps) >= 8, gaps
    await wait_in_flight(live, 0)


async def test_client_leaving_mid_stream_leaves_nothing_in_flight(live: Stack) -> None:
    oa = live.client()
    # n=8 choices of 10 tokens each, streamed one after another: about 5 s of stream.
    stream = await oa.chat.completions.create(
        model="demo",
        messages=MSG,  # type: ignore[arg-type]
        stream=True,
        n=8,
    )
    got = 0
    async for _chunk in stream:
        got += 1
        if got == 3:
            assert await in_flight(live) == 1  # counted while it streams
            break
    await stream.close()
    # Uncounted as soon as the client leaves, long before the stream would have ended, and
    # the upstream request ends too (the simulator stops generating for it).
    await wait_in_flight(live, 0, within=2.5)
    await wait_sim_idle(live, within=2.5)


async def test_client_leaving_before_the_answer_starts(live: Stack) -> None:
    live.sim.app.faults.add([SimFault(delay_ms=30_000, count=1)])
    oa = live.client()
    call = oa.chat.completions.create(model="demo", messages=MSG)  # type: ignore[arg-type]
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(call, 1.0)
    await wait_in_flight(live, 0, within=5)
    await wait_sim_idle(live, within=5)


async def wait_sim_idle(stack: Stack, within: float) -> None:
    deadline = time.monotonic() + within
    while (n := stack.sim.app.stats_dict()["live"]["concurrent"]) != 0:
        assert time.monotonic() < deadline, f"the simulator still serves {n} live requests"
        await asyncio.sleep(0.05)


async def test_errors_come_back_in_the_envelope(live: Stack) -> None:
    async with httpx.AsyncClient(base_url=live.api_url, headers=auth()) as http:
        # Unknown model: 404 model_not_found, nothing sent upstream, nothing counted.
        before = len(live.sim.app.seen)
        body = {"model": "no-such-model", "messages": MSG}
        resp = await http.post("/v1/chat/completions", json=body)
        assert_error(resp, 404, param="model", code="model_not_found")
        assert len(live.sim.app.seen) == before
        # The upstream's own envelope (the simulator's 400 for a bad body) is passed through.
        resp = await http.post("/v1/chat/completions", json={"model": "demo", "messages": "x"})
        assert resp.status_code == 400
        assert "messages" in resp.json()["error"]["message"]
        # Bad JSON and a missing model never reach the upstream.
        resp = await http.post("/v1/embeddings", content=b"{nope")
        assert_error(resp, 400)
        assert_error(await http.post("/v1/embeddings", json={"input": "x"}), 400, param="model")
        # Too large a body: 413 before parsing.
        big = b'{"model": "demo", "input": "' + b"x" * (1024 * 1024) + b'"}'
        resp = await http.post("/v1/embeddings", content=big)
        assert_error(resp, 413, code="request_too_large")
        # A gateway key is still needed.
        resp = await http.post("/v1/chat/completions", json=body, headers={"Authorization": ""})
        assert_error(resp, 401, code="invalid_api_key")
    assert await in_flight(live) == 0


async def test_bodies_that_are_not_strict_json_are_refused_with_400(live: Stack) -> None:
    """Nesting past the limit (a 500 with a traceback before) and numbers Python reads as
    infinity (sent on as `Infinity` before) are the client's error, and never reach upstream."""
    head = b'{"model": "demo", "messages": [{"role": "user", "content": "hi"}], "x": '
    async with httpx.AsyncClient(base_url=live.api_url, headers=auth()) as http:
        before = len(live.sim.app.seen)
        for levels in (1000, 100_000):
            deep = head + b"[" * levels + b"]" * levels + b"}"
            err = assert_error(await http.post("/v1/chat/completions", content=deep), 400)
            assert "more than 128 levels deep" in err["message"]
        for number in (b"1e999", b"-1E+400", b"NaN"):
            body = head + number + b"}"
            err = assert_error(await http.post("/v1/chat/completions", content=body), 400)
            assert "not valid JSON" in err["message"]
        assert len(live.sim.app.seen) == before
        # 128 levels in all is accepted and forwarded.
        fine = head + b"[" * 126 + b"]" * 126 + b"}"
        assert (await http.post("/v1/chat/completions", content=fine)).status_code == 200
    assert await in_flight(live) == 0


async def test_a_client_priority_never_reaches_the_model_server(live: Stack) -> None:
    """Only the gateway sets `priority` (on batch lines): a client's own is dropped."""
    oa = live.client()
    chat = await oa.chat.completions.create(
        model="demo",
        messages=MSG,  # type: ignore[arg-type]
        extra_body={"priority": -100},
    )
    assert chat.choices[0].message.content
    seen = live.sim.app.seen[-1]
    assert seen.path == "/v1/chat/completions" and not seen.has_priority
    emb = await oa.embeddings.create(model="demo", input="x", extra_body={"priority": -100})
    assert emb.data and not live.sim.app.seen[-1].has_priority
    assert live.sim.app.stats_dict()["priorities_seen"].keys() <= {"0"}


async def test_upstream_4xx_5xx_pass_through(live: Stack) -> None:
    oa = live.client()
    sim = live.sim.app
    sim.faults.add([SimFault(status=429, count=1, retry_after=2, message="slow down")])
    with pytest.raises(openai.RateLimitError) as rate:
        await oa.chat.completions.create(model="demo", messages=MSG)  # type: ignore[arg-type]
    assert rate.value.response.headers["retry-after"] == "2"
    assert rate.value.body["message"] == "slow down"  # type: ignore[index]
    sim.faults.add([SimFault(status=503, count=1)])
    with pytest.raises(openai.InternalServerError) as unavailable:
        await oa.embeddings.create(model="demo", input="x")
    assert unavailable.value.status_code == 503
    assert await in_flight(live) == 0


async def test_non_envelope_upstream_error_is_wrapped(
    tmp_path: Path, dev_server: TemporalServer
) -> None:
    """An upstream answering a bare text 500 (not OpenAI's envelope), and one that is down."""
    from fastapi import FastAPI
    from fastapi.responses import PlainTextResponse

    from tools.dev.procs import free_port

    bare = FastAPI()

    @bare.post("/v1/chat/completions")
    async def boom() -> PlainTextResponse:
        return PlainTextResponse("engine exploded", status_code=500)

    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(bare, port=port, log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve())
    stack = Stack(tmp_path, dev_server.address)
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        async with stack.running():
            stack.config_path.write_text(
                stack.config_path.read_text().replace(
                    stack.sim.base_url, f"http://127.0.0.1:{port}/v1"
                )
            )
            await asyncio.to_thread(stack.api.stop)
            stack.api.start(stack.api.argv, stack.env(), stack.tmp / "api.log")
            await stack.wait_healthy()
            async with httpx.AsyncClient(base_url=stack.api_url, headers=auth()) as http:
                body = {"model": "demo", "messages": MSG}
                resp = await http.post("/v1/chat/completions", json=body)
                err = assert_error(resp, 500, code="upstream_error", type_="server_error")
                assert "engine exploded" in err["message"]
                server.should_exit = True
                await task
                resp = await http.post("/v1/chat/completions", json=body)
                assert_error(resp, 502, code="upstream_unavailable", type_="server_error")
            assert await in_flight(stack) == 0
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


async def test_request_id_round_trip(live: Stack) -> None:
    async with httpx.AsyncClient(base_url=live.api_url, headers=auth()) as http:
        body = {"model": "demo", "messages": MSG}
        resp = await http.post(
            "/v1/chat/completions",
            json=body,
            headers={"X-Request-ID": "my-trace-42", "X-Backfill-Batch": "batch_forged"},
        )
        assert resp.status_code == 200 and resp.headers["x-request-id"] == "my-trace-42"
        seen = live.sim.app.seen[-1]
        assert seen.request_id == "my-trace-42"
        assert seen.batch is None  # the client's X-Backfill-Batch is not passed on
        assert seen.authorization == f"Bearer {UPSTREAM_KEY}"  # never the gateway key
        # Generated when absent, and the same one upstream and back.
        resp = await http.post("/v1/chat/completions", json=body)
        rid = resp.headers["x-request-id"]
        assert rid.startswith("req_") and live.sim.app.seen[-1].request_id == rid
        # Error answers carry one too.
        resp = await http.post("/v1/chat/completions", json={"model": "x", "messages": MSG})
        assert resp.status_code == 404 and resp.headers["x-request-id"].startswith("req_")
    assert live.sim.app.stats_dict()["priorities_seen"].keys() <= {"0"}
    assert live.sim.app.stats_dict()["batch"]["requests_total"] == 0
    assert API_KEY not in {s.authorization for s in live.sim.app.seen}


# ---- isolation from Temporal -------------------------------------------------------------------


async def live_requests_flow(stack: Stack, n: int = 8, each_within: float = 2.0) -> list[float]:
    """n live chat completions in a row, each answered in time; their latencies."""
    oa = stack.client()
    latencies = []
    for _ in range(n):
        t0 = time.monotonic()
        chat = await oa.chat.completions.create(model="demo", messages=MSG)  # type: ignore[arg-type]
        latencies.append(time.monotonic() - t0)
        assert chat.choices[0].message.content
    assert max(latencies) < each_within, latencies
    return latencies


async def assert_batches_unavailable(
    stack: Stack, batch_id: str, within: float, path: str = "/v1/batches/{batch_id}"
) -> float:
    """GET the batch (or `path`: the listing): a 503 `temporal_unavailable` envelope within
    `within` s; the time taken."""
    async with httpx.AsyncClient(base_url=stack.api_url, headers=auth(), timeout=60) as http:
        t0 = time.monotonic()
        resp = await http.get(path.format(batch_id=batch_id))
        took = time.monotonic() - t0
    assert_error(resp, 503, code="temporal_unavailable", type_="server_error")
    assert took < within, f"503 after {took:.1f}s"
    return took


async def health(stack: Stack) -> dict[str, str]:
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=30) as http:
        resp = await http.get("/healthz")
    assert resp.status_code == 200
    return resp.json()  # type: ignore[no-any-return]


async def test_live_traffic_does_not_depend_on_temporal(tmp_path: Path) -> None:
    import signal

    from tests.e2e.stack import submit, wait_terminal
    from tools.dev.devserver import DevServer
    from tools.dev.procs import free_port

    server = DevServer(tmp_path / "temporal", port=free_port(), ui_port=None)
    server.start()
    stack = Stack(tmp_path, server.address, sim=SimConfig(model_names=[], latency_ms=5))
    try:
        await server.wait_ready_async(timeout=60)
        async with stack.running():
            oa = stack.client()
            before = await submit(stack, 5, prefix="before")
            assert (await wait_terminal(oa, before, within=120)).status == "completed"
            baseline = await live_requests_flow(stack)
            # Uploaded while Temporal is up: an upload under a storage limit (every workspace has
            # one by default) needs the admission's count of pinned inputs (decision 0027).
            f = await oa.files.create(file=("x.jsonl", b"{}\n"), purpose="batch")

            # Temporal frozen (slow: connections open, no answers).
            server.send_signal(signal.SIGSTOP)
            try:
                frozen = await live_requests_flow(stack)
                frozen_503 = await assert_batches_unavailable(stack, before, within=12)
                # A listing's every call (counts included) has its deadline too.
                await assert_batches_unavailable(stack, before, within=12, path="/v1/batches")
                doc = await health(stack)
                assert doc["status"] == "degraded" and doc["temporal"] == "unavailable", doc
                assert doc["live_proxy"] == "ok"
            finally:
                server.send_signal(signal.SIGCONT)
            await stack.wait_healthy()

            # Temporal stopped.
            await asyncio.to_thread(server.stop)
            stopped = await live_requests_flow(stack)
            stopped_503 = await assert_batches_unavailable(stack, before, within=10)
            doc = await health(stack)
            assert doc["status"] == "degraded" and doc["temporal"] == "unavailable", doc
            # Reading files does not need Temporal; an upload under a storage limit (it counts the
            # pinned inputs of running batches) and creating a batch answer 503.
            assert (await oa.files.retrieve(f.id)).bytes == 3
            with pytest.raises(openai.InternalServerError) as upload:
                await oa.files.create(file=("y.jsonl", b"{}\n"), purpose="batch")
            assert upload.value.status_code == 503
            assert upload.value.code == "temporal_unavailable"
            with pytest.raises(openai.InternalServerError) as create:
                await oa.batches.create(
                    input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
                )
            assert create.value.status_code == 503
            assert create.value.code == "temporal_unavailable"
            # ... and the failed create left no pinned copy of its input behind.
            pinned = [k for k in stack.store().keys("batches/") if k.endswith("/input.jsonl")]
            assert pinned == [], pinned  # (the finished batch dropped its own at the end)

            # An api (re)started while Temporal is down comes up and serves live traffic.
            await asyncio.to_thread(stack.api.stop)
            stack.api.start(stack.api.argv, stack.env(), stack.tmp / "api.log")
            await stack.wait_healthy(temporal=False)
            assert (await health(stack))["status"] == "degraded"
            restarted = await live_requests_flow(stack)
            await assert_batches_unavailable(stack, before, within=2)

            # Temporal back on the same db file and port: batches work again.
            server.start()
            await server.wait_ready_async(timeout=60)
            await stack.wait_healthy(within=30)
            assert (await oa.batches.retrieve(before)).status == "completed"
            # A create needs the admission workflow's answer: the worker polls again only once
            # its reconnect back-off lets it (a create before that answers 503, as documented).
            await stack.wait_polled()
            after = await submit(stack, 5, prefix="after")
            assert (await wait_terminal(oa, after, within=120)).status == "completed"
            for name, values in [
                ("baseline", baseline),
                ("frozen", frozen),
                ("stopped", stopped),
                ("api restarted", restarted),
            ]:
                print(f"live latency {name}: max {max(values) * 1000:.0f} ms")
            print(f"503 after {frozen_503:.2f} s (frozen), {stopped_503:.2f} s (stopped)")
    finally:
        await asyncio.to_thread(server.stop)


async def test_sdk_responses_whole_and_streamed_event_by_event(live: Stack) -> None:
    """`/v1/responses` through the registry: relayed, streamed event by event, counted."""
    oa = live.client()
    resp = await oa.responses.create(model="demo", input="one two three")
    assert resp.object == "response" and resp.id.startswith("resp_")
    assert resp.output_text == "Simulated one two three"
    assert resp.usage is not None and resp.usage.output_tokens == 4
    assert live.sim.app.seen[-1].path == "/v1/responses"
    loop = asyncio.get_running_loop()
    kinds: list[str] = []
    arrivals: list[float] = []  # of the deltas
    text = ""
    stream = await oa.responses.create(
        model="demo",
        input=[{"role": "user", "content": "four five six"}],
        stream=True,
        extra_body={"priority": -5},
    )
    async for event in stream:
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            arrivals.append(loop.time())
            text += event.delta
            if len(arrivals) == 1:  # the first word: still one request in flight
                assert await in_flight(live) == 1
        elif event.type == "response.completed":
            assert event.response.usage is not None
            assert event.response.usage.input_tokens == 3
    assert text == "Simulated four five six"
    assert kinds == [  # OpenAI's and vLLM's order: each item and part announced before its text
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * 4,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    # The 4 words, each produced TOKEN_DELAY_MS after the one before, arrive spread out: relayed,
    # not buffered. (Measured from the first word: the events before it may reach the client in
    # the same read as the first word on a loaded machine, seen once in CI.)
    assert arrivals[3] - arrivals[0] >= 0.8 * 3 * TOKEN_DELAY_MS / 1000
    assert not live.sim.app.seen[-1].has_priority
    await wait_in_flight(live, 0)


async def test_sdk_responses_stream_helper_assembles_the_answer(live: Stack) -> None:
    """The SDK's `client.responses.stream()` helper (it needs `response.output_item.added` and
    `response.content_part.added` before any text) works through the proxy, as against vLLM."""
    oa = live.client()
    deltas = []
    async with oa.responses.stream(model="demo", input="seven eight") as stream:
        async for event in stream:
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = await stream.get_final_response()
    assert "".join(deltas) == "Simulated seven eight" == final.output_text
    assert final.status == "completed" and final.usage is not None
    assert final.usage.input_tokens == 2 and final.usage.output_tokens == 3
    await wait_in_flight(live, 0)
