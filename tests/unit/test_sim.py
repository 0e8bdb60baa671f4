"""The vLLM-like simulator (tools.sim), driven over real loopback HTTP."""

from __future__ import annotations

import array
import asyncio
import base64
import json
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types import Completion, CreateEmbeddingResponse
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from prometheus_client.parser import text_string_to_metric_families

from tools.sim import BATCH_HEADER, Scheduler, SimConfig, SimServer, create_app
from tools.sim.faults import SimFault

ROOT = Path(__file__).resolve().parents[2]
CHAT = "/v1/chat/completions"
MSG: list[Any] = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "hello there sim"},
]


def chat_body(**extra: Any) -> dict[str, Any]:
    return {"model": "demo", "messages": MSG, **extra}


@pytest.fixture(scope="module")
async def sim() -> AsyncIterator[SimServer]:
    async with SimServer(SimConfig(model_names=["demo", "other"], latency_ms=0)) as server:
        yield server


@pytest.fixture
async def client(sim: SimServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=sim.url, timeout=10) as c:
        assert (await c.delete("/sim/faults")).status_code == 200
        assert (await c.post("/sim/stats/reset")).status_code == 200
        yield c


async def stats(c: httpx.AsyncClient) -> dict[str, Any]:
    r = await c.get("/sim/stats")
    assert r.status_code == 200
    return r.json()  # type: ignore[no-any-return]


async def wait_stats(c: httpx.AsyncClient, pred: Callable[[dict[str, Any]], bool]) -> dict:
    """Poll /sim/stats (each poll is a loopback round trip) until pred holds."""
    deadline = asyncio.get_running_loop().time() + 5
    while not pred(s := await stats(c)):
        assert asyncio.get_running_loop().time() < deadline, f"condition never held: {s}"
    return s


def parse_metrics(text: str) -> dict[str, float]:
    return {
        f"{s.name}|{s.labels.get('finished_reason', '')}": s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


async def test_chat_completion_shape(client: httpx.AsyncClient) -> None:
    r = await client.post(CHAT, json=chat_body(), headers={"x-request-id": "req-42"})
    assert r.status_code == 200
    assert r.headers["x-request-id"] == "req-42"
    cc = ChatCompletion.model_validate(r.json())
    assert cc.id.startswith("chatcmpl-") and cc.object == "chat.completion"
    assert cc.model == "demo" and len(cc.choices) == 1
    choice = cc.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason == "stop"
    assert choice.message.content == "Simulated hello there sim"
    assert choice.logprobs is None and r.json()["choices"][0]["logprobs"] is None
    assert cc.usage is not None
    assert (cc.usage.prompt_tokens, cc.usage.completion_tokens) == (5, 4)
    assert cc.usage.total_tokens == 9
    again = await client.post(CHAT, json=chat_body())
    assert again.json()["choices"] == r.json()["choices"]  # deterministic
    assert again.headers["x-request-id"] and again.headers["x-request-id"] != "req-42"


async def test_chat_max_tokens_n_and_content_parts(client: httpx.AsyncClient) -> None:
    parts = [{"role": "user", "content": [{"type": "text", "text": "one two three four"}]}]
    body = {"model": "other", "messages": parts, "max_completion_tokens": 2, "n": 2}
    cc = ChatCompletion.model_validate((await client.post(CHAT, json=body)).json())
    assert [c.index for c in cc.choices] == [0, 1]
    assert {c.message.content for c in cc.choices} == {"Simulated one"}
    assert {c.finish_reason for c in cc.choices} == {"length"}
    assert cc.usage is not None and cc.usage.completion_tokens == 4


async def test_completions_shape(client: httpx.AsyncClient) -> None:
    body = {"model": "demo", "prompt": ["a b c", "d e"], "max_tokens": 3}
    r = await client.post("/v1/completions", json=body)
    assert r.status_code == 200
    comp = Completion.model_validate(r.json())
    assert comp.id.startswith("cmpl-") and comp.object == "text_completion"
    assert [(c.index, c.text, c.finish_reason) for c in comp.choices] == [
        (0, "Simulated a b", "length"),
        (1, "Simulated d e", "stop"),
    ]
    assert comp.usage is not None and comp.usage.prompt_tokens == 5
    assert comp.usage.completion_tokens == 6 and comp.usage.total_tokens == 11
    ids = await client.post("/v1/completions", json={"model": "demo", "prompt": [1, 2, 3]})
    assert Completion.model_validate(ids.json()).usage.prompt_tokens == 3  # type: ignore[union-attr]


async def test_embeddings_shape_and_base64(client: httpx.AsyncClient) -> None:
    body = {"model": "demo", "input": ["alpha", "beta"]}
    r = await client.post("/v1/embeddings", json=body)
    assert r.status_code == 200
    emb = CreateEmbeddingResponse.model_validate(r.json())
    assert emb.object == "list" and emb.model == "demo"
    assert [(d.object, d.index, len(d.embedding)) for d in emb.data] == [
        ("embedding", 0, 16),
        ("embedding", 1, 16),
    ]
    assert emb.data[0].embedding != emb.data[1].embedding
    assert abs(sum(v * v for v in emb.data[0].embedding) - 1.0) < 1e-9
    assert emb.usage.prompt_tokens == 2 and emb.usage.total_tokens == 2
    b64 = await client.post("/v1/embeddings", json={**body, "encoding_format": "base64"})
    raw = base64.b64decode(b64.json()["data"][0]["embedding"])
    floats = array.array("f", raw).tolist()
    assert floats == pytest.approx(emb.data[0].embedding, abs=1e-6)
    dims = await client.post("/v1/embeddings", json={**body, "input": "x", "dimensions": 4})
    assert len(dims.json()["data"][0]["embedding"]) == 4


async def test_streaming_chat_sse(client: httpx.AsyncClient) -> None:
    plain = (await client.post(CHAT, json=chat_body())).json()["choices"][0]["message"]
    body = chat_body(stream=True, stream_options={"include_usage": True})
    r = await client.post(CHAT, json=body)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [e for e in r.text.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    chunks = [ChatCompletionChunk.model_validate(json.loads(e[6:])) for e in events[:-1]]
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain["content"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 4
    comp = await client.post("/v1/completions", json={"model": "demo", "prompt": "x", "stream": 1})
    pieces = [json.loads(e[6:]) for e in comp.text.split("\n\n") if e and e != "data: [DONE]"]
    assert "".join(p["choices"][0]["text"] for p in pieces) == "Simulated x"


async def test_openai_sdk_against_sim(sim: SimServer) -> None:
    async with openai.AsyncOpenAI(base_url=sim.base_url, api_key="sk-x", max_retries=0) as oa:
        cc = await oa.chat.completions.create(model="demo", messages=MSG)
        assert cc.choices[0].message.content == "Simulated hello there sim"
        comp = await oa.completions.create(model="demo", prompt="hi", max_tokens=1)
        assert comp.choices[0].text == "Simulated" and comp.choices[0].finish_reason == "length"
        emb = await oa.embeddings.create(model="demo", input="hi")  # SDK asks for base64
        assert len(emb.data[0].embedding) == 16
        stream = await oa.chat.completions.create(model="demo", messages=MSG, stream=True)
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        assert text == "Simulated hello there sim"
        assert [m.id for m in (await oa.models.list()).data] == ["demo", "other"]
        with pytest.raises(openai.NotFoundError):
            await oa.chat.completions.create(model="nope", messages=MSG)


async def test_unknown_model_is_404(client: httpx.AsyncClient) -> None:
    r = await client.post(CHAT, json={**chat_body(), "model": "x"})
    assert r.status_code == 404
    assert r.json() == {
        "error": {
            "message": "The model `x` does not exist.",
            "type": "NotFoundError",
            "param": "model",
            "code": 404,
        }
    }


@pytest.mark.parametrize(
    ("path", "content"),
    [
        (CHAT, b"{not json"),
        (CHAT, b"[1, 2]"),
        (CHAT, json.dumps({"messages": MSG}).encode()),
        (CHAT, json.dumps({"model": "demo"}).encode()),
        (CHAT, json.dumps({"model": "demo", "messages": []}).encode()),
        (CHAT, json.dumps({**chat_body(), "priority": "high"}).encode()),
        ("/v1/completions", json.dumps({"model": "demo"}).encode()),
        ("/v1/completions", json.dumps({"model": "demo", "prompt": [{}]}).encode()),
        ("/v1/embeddings", json.dumps({"model": "demo"}).encode()),
    ],
)
async def test_bad_body_is_400(client: httpx.AsyncClient, path: str, content: bytes) -> None:
    r = await client.post(path, content=content, headers={"content-type": "application/json"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert (err["type"], err["param"], err["code"]) == ("BadRequestError", None, 400)
    assert err["message"]


async def test_health_models_and_unknown_routes(client: httpx.AsyncClient) -> None:
    assert (await client.get("/health")).status_code == 200
    models = (await client.get("/v1/models")).json()
    assert models["object"] == "list"
    assert [(m["id"], m["object"]) for m in models["data"]] == [
        ("demo", "model"),
        ("other", "model"),
    ]
    assert (await client.get("/nope")).status_code == 404
    assert (await client.get(CHAT)).status_code == 405


async def test_metrics_text_format(client: httpx.AsyncClient) -> None:
    await client.post(CHAT, json=chat_body())
    await client.post(CHAT, json=chat_body(max_tokens=1))
    r = await client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    lines = r.text.splitlines()
    for name, kind in [
        ("vllm:num_requests_running", "gauge"),
        ("vllm:num_requests_waiting", "gauge"),
        ("vllm:kv_cache_usage_perc", "gauge"),
        ("vllm:request_success_total", "counter"),
    ]:
        assert any(line.startswith(f"# HELP {name} ") for line in lines), name
        assert f"# TYPE {name} {kind}" in lines
    assert 'vllm:num_requests_running{engine="0",model_name="demo"} 0.0' in lines
    assert 'vllm:num_requests_waiting{engine="0",model_name="demo"} 0.0' in lines
    m = parse_metrics(r.text)
    assert 0.0 <= m["vllm:kv_cache_usage_perc|"] <= 1.0
    assert m["vllm:request_success_total|stop"] >= 1
    assert m["vllm:request_success_total|length"] >= 1
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    sample = families["vllm:num_requests_running"].samples[0]
    assert sample.labels == {"engine": "0", "model_name": "demo"}


async def test_capacity_running_never_exceeds_max_num_seqs() -> None:
    config = SimConfig(max_num_seqs=2, latency_ms=150)
    async with SimServer(config) as sim, httpx.AsyncClient(base_url=sim.url, timeout=10) as c:
        tasks = [asyncio.create_task(c.post(CHAT, json=chat_body())) for _ in range(6)]
        deadline = asyncio.get_running_loop().time() + 5
        while True:  # scrape until the queue shows up: then the engine is saturated
            m = parse_metrics((await c.get("/metrics")).text)
            if m["vllm:num_requests_waiting|"] > 0:
                break
            assert asyncio.get_running_loop().time() < deadline
        assert m["vllm:num_requests_running|"] == 2.0
        assert m["vllm:kv_cache_usage_perc|"] == 1.0
        assert all(r.status_code == 200 for r in await asyncio.gather(*tasks))
        s = await stats(c)
        assert s["peak_running"] == 2 and s["peak_waiting"] >= 1
        assert s["peak_concurrent"] == 6 and s["requests_total"] == 6
        assert (s["running"], s["waiting"], s["concurrent"]) == (0, 0, 0)
        assert s["responses_by_status"] == {"200": 6} and s["kv_cache_usage"] == 0.0


@pytest.mark.parametrize(("policy", "expected"), [("priority", [1, 3, 5]), ("fcfs", [5, 1, 3])])
async def test_scheduling_order(policy: str, expected: list[int]) -> None:
    config = SimConfig(max_num_seqs=1, latency_ms=20, scheduling_policy=policy)  # type: ignore[arg-type]
    async with SimServer(config) as sim, httpx.AsyncClient(base_url=sim.url, timeout=10) as c:
        await sim.app.scheduler.acquire()  # occupy the only slot, like one endless request
        done: list[int] = []

        async def one(priority: int) -> None:
            r = await c.post(CHAT, json=chat_body(priority=priority))
            assert r.status_code == 200
            done.append(priority)

        tasks = []
        for queued, priority in enumerate([5, 1, 3], start=1):
            tasks.append(asyncio.create_task(one(priority)))
            await wait_stats(c, lambda s, q=queued: s["waiting"] == q)  # type: ignore[misc]
        assert done == []
        sim.app.scheduler.release()
        await asyncio.gather(*tasks)
        assert done == expected
        s = await stats(c)
        assert s["priorities_seen"] == {"5": 1, "1": 1, "3": 1}
        assert s["peak_running"] == 1 and s["peak_waiting"] == 3


async def test_client_disconnect_while_waiting_leaves_the_queue() -> None:
    config = SimConfig(max_num_seqs=1, latency_ms=0)
    async with SimServer(config) as sim, httpx.AsyncClient(base_url=sim.url, timeout=10) as c:
        await sim.app.scheduler.acquire()
        task = asyncio.create_task(c.post(CHAT, json=chat_body()))
        await wait_stats(c, lambda s: s["waiting"] == 1)
        task.cancel()
        s = await wait_stats(c, lambda s: s["aborted"] == 1)
        assert (s["waiting"], s["running"], s["concurrent"]) == (0, 1, 0)
        sim.app.scheduler.release()
        assert (await c.post(CHAT, json=chat_body())).status_code == 200
        assert (await stats(c))["running"] == 0


async def test_scheduler_priority_ties_and_cancellation() -> None:
    sched, order = Scheduler(1, use_priority=True), []
    await sched.acquire()

    async def waiter(name: str, prio: int) -> None:
        await sched.acquire(prio)
        order.append(name)
        sched.release()

    specs = [("a", 2), ("b", 1), ("c", 1), ("d", 1)]
    tasks = {n: asyncio.create_task(waiter(n, p)) for n, p in specs}
    await asyncio.sleep(0)  # one loop pass: every waiter is queued
    assert (sched.running, sched.waiting) == (1, 4)
    tasks["b"].cancel()
    await asyncio.sleep(0)
    assert sched.waiting == 3
    sched.release()
    await asyncio.gather(tasks["a"], tasks["c"], tasks["d"])
    assert order == ["c", "d", "a"]  # lower value first, ties in arrival order
    assert (sched.running, sched.waiting, sched.peak_running) == (0, 0, 1)


def test_latency_grows_with_load_and_kv_fraction() -> None:
    app = create_app(SimConfig(latency_ms=10, latency_per_running_ms=5, max_num_seqs=4))
    assert app.processing_delay_s(1) == pytest.approx(0.010)
    assert app.processing_delay_s(3) == pytest.approx(0.020)
    assert app.scheduler.try_acquire() and app.scheduler.try_acquire()
    assert app.kv_cache_usage == 0.5
    assert create_app(SimConfig(kv_usage_per_request=0.9)).kv_cache_usage == 0.0


async def test_fault_status_count(client: httpx.AsyncClient) -> None:
    r = await client.post("/sim/faults", json={"status": 503, "count": 2})
    assert r.status_code == 200 and r.json()["faults"][0]["remaining"] == 2
    codes = [(await client.post(CHAT, json=chat_body())).status_code for _ in range(3)]
    assert codes == [503, 503, 200]
    r = await client.post("/sim/faults", json={"status": 503, "count": 1})
    err = (await client.post(CHAT, json=chat_body())).json()["error"]
    assert (err["type"], err["code"]) == ("ServiceUnavailableError", 503)
    s = await stats(client)
    assert s["responses_by_status"] == {"503": 3, "200": 1} and s["faults_active"] == 0


async def test_fault_delay(client: httpx.AsyncClient) -> None:
    await client.post("/sim/faults", json={"delay_ms": 300, "count": 1})
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    assert (await client.post(CHAT, json=chat_body())).status_code == 200
    assert loop.time() - t0 >= 0.3
    await client.post("/sim/faults", json={"delay_ms": 2000, "count": 1})
    with pytest.raises(httpx.ReadTimeout):  # the delay really holds the response back
        await client.post(CHAT, json=chat_body(), timeout=0.2)
    s = await wait_stats(client, lambda s: s["concurrent"] == 0)
    assert s["responses_by_status"] == {"200": 1} and s["aborted"] == 1


async def test_fault_drop_closes_connection(client: httpx.AsyncClient) -> None:
    await client.post("/sim/faults", json={"drop": True, "count": 1})
    with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
        await client.post(CHAT, json=chat_body())
    assert (await client.post(CHAT, json=chat_body())).status_code == 200
    s = await stats(client)
    assert s["dropped"] == 1 and s["responses_by_status"] == {"200": 1}


async def test_fault_rate_is_probabilistic_and_clearable(client: httpx.AsyncClient) -> None:
    await client.post("/sim/faults", json={"status": 500, "rate": 0.5})
    codes = [(await client.post(CHAT, json=chat_body())).status_code for _ in range(40)]
    assert 0 < codes.count(500) < 40 and codes.count(200) == 40 - codes.count(500)
    listed = (await client.get("/sim/faults")).json()["faults"]
    assert listed[0]["fired"] == codes.count(500) and listed[0]["remaining"] is None
    assert (await client.delete("/sim/faults")).json() == {"faults": []}
    assert (await client.post(CHAT, json=chat_body())).status_code == 200


async def test_fault_matching_batch_header_only(client: httpx.AsyncClient) -> None:
    fault = {"status": 429, "match_custom_header": BATCH_HEADER, "retry_after": 2}
    await client.post("/sim/faults", json=[fault])
    assert (await client.post(CHAT, json=chat_body())).status_code == 200
    r = await client.post(CHAT, json=chat_body(), headers={BATCH_HEADER: "batch_1"})
    assert r.status_code == 429 and r.headers["retry-after"] == "2"
    assert r.json()["error"]["type"] == "RateLimitError"
    path_fault = {"status": 500, "match_path": "/v1/embeddings", "count": 1}
    await client.post("/sim/faults", json=path_fault)
    assert (await client.post(CHAT, json=chat_body())).status_code == 200
    emb = await client.post("/v1/embeddings", json={"model": "demo", "input": "x"})
    assert emb.status_code == 500


@pytest.mark.parametrize(
    "bad", [{}, {"status": 200}, {"status": 503, "drop": True}, {"bogus": 1}, [{"count": 1}]]
)
async def test_invalid_fault_is_400(client: httpx.AsyncClient, bad: Any) -> None:
    r = await client.post("/sim/faults", json=bad)
    assert r.status_code == 400 and r.json()["error"]["type"] == "BadRequestError"
    assert (await client.get("/sim/faults")).json() == {"faults": []}


async def test_batch_header_accounting(client: httpx.AsyncClient) -> None:
    await client.post("/sim/faults", json={"delay_ms": 400, "match_custom_header": BATCH_HEADER})
    batch = [
        asyncio.create_task(client.post(CHAT, json=chat_body(), headers={BATCH_HEADER: b}))
        for b in ("batch_a", "batch_a", "batch_b")
    ]
    mid = await wait_stats(client, lambda s: s["batch"]["concurrent"] == 3)
    assert mid["concurrent"] == 3 and mid["live"]["concurrent"] == 0
    live = [await client.post(CHAT, json=chat_body()) for _ in range(2)]
    # live traffic is not delayed and is counted separately
    assert all(r.status_code == 200 for r in live)
    done = await asyncio.gather(*batch)
    assert all(r.status_code == 200 for r in done)

    def tokens(answers: list[httpx.Response], kind: str) -> int:
        return sum(r.json()["usage"][kind] for r in answers)

    s = await stats(client)
    assert tokens(done, "completion_tokens") > 0
    assert s["batch"] == {
        "requests_total": 3,
        "concurrent": 0,
        "peak_concurrent": 3,
        "prompt_tokens": tokens(done, "prompt_tokens"),
        "completion_tokens": tokens(done, "completion_tokens"),
        "by_batch": {"batch_a": 2, "batch_b": 1},
    }
    assert s["live"] == {
        "requests_total": 2,
        "concurrent": 0,
        "peak_concurrent": 1,
        "prompt_tokens": tokens(live, "prompt_tokens"),
        "completion_tokens": tokens(live, "completion_tokens"),
    }
    assert s["requests_total"] == 5 and s["peak_concurrent"] == 4


async def test_stats_reset_keeps_in_flight(client: httpx.AsyncClient) -> None:
    for _ in range(3):
        await client.post(CHAT, json=chat_body(priority=7))
    await client.post("/sim/faults", json={"delay_ms": 300, "count": 1})
    slow = asyncio.create_task(client.post(CHAT, json=chat_body()))
    await wait_stats(client, lambda s: s["concurrent"] == 1)
    r = await client.post("/sim/stats/reset")
    s = r.json()
    assert (s["requests_total"], s["responses_by_status"], s["priorities_seen"]) == (0, {}, {})
    assert (s["concurrent"], s["peak_concurrent"], s["live"]["concurrent"]) == (1, 1, 1)
    assert s["live"]["requests_total"] == 0 and s["peak_running"] == 0
    assert (await slow).status_code == 200
    s = await stats(client)
    assert s["responses_by_status"] == {"200": 1} and s["concurrent"] == 0


async def test_config_faults_and_any_model() -> None:
    config = SimConfig(model_names=[], latency_ms=0, faults=[SimFault(status=500, count=1)])
    async with SimServer(config) as sim, httpx.AsyncClient(base_url=sim.url, timeout=10) as c:
        body = {"model": "whatever/Model-7B", "messages": MSG}
        first = await c.post(CHAT, json=body)
        assert first.status_code == 500
        assert first.json()["error"]["type"] == "InternalServerError"
        second = ChatCompletion.model_validate((await c.post(CHAT, json=body)).json())
        assert second.model == "whatever/Model-7B"
        assert [m["id"] for m in (await c.get("/v1/models")).json()["data"]] == ["demo"]
        assert 'model_name="demo"' in (await c.get("/metrics")).text


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_main_serves_until_sigterm() -> None:
    port = _free_port()
    code = "import sys; from tools.sim import main; sys.exit(main(sys.argv[1:]))"
    args = ["--port", str(port), "--model", "m1", "--max-num-seqs", "3", "--log-level", "warning"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", code, *args, env=env)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as c:
            deadline = asyncio.get_running_loop().time() + 20
            while True:
                try:
                    r = await c.get("/v1/models")
                    break
                except httpx.TransportError:
                    assert proc.returncode is None and asyncio.get_running_loop().time() < deadline
                    await asyncio.sleep(0.05)  # waiting for a child process to boot
            assert [m["id"] for m in r.json()["data"]] == ["m1"]
            assert (await c.post(CHAT, json={"model": "demo", "messages": MSG})).status_code == 404
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 10) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_stream_token_delay_paces_events_and_stops_on_disconnect() -> None:
    async with SimServer(SimConfig(stream_token_delay_ms=40)) as sim:
        async with httpx.AsyncClient(base_url=sim.url) as c:
            loop = asyncio.get_running_loop()
            arrivals: list[float] = []
            body = chat_body(stream=True)
            async with c.stream("POST", CHAT, json=body) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        arrivals.append(loop.time())
            # role + 4 words + finish + [DONE]: each event but [DONE] waits 40 ms.
            assert len(arrivals) == 7
            assert arrivals[-2] - arrivals[0] >= 4 * 0.04 * 0.9
            # A client that leaves mid-stream frees the running slot at once.
            long = chat_body(stream=True, messages=[{"role": "user", "content": "w " * 20}])
            async with c.stream("POST", CHAT, json=long) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        break
            await wait_stats(c, lambda s: s["running"] == 0 and s["aborted"] == 1)


async def test_seen_requests_record_headers_and_priority(
    sim: SimServer, client: httpx.AsyncClient
) -> None:
    headers = {"X-Request-ID": "rid-1", BATCH_HEADER: "batch_1", "Authorization": "Bearer k"}
    await client.post(CHAT, json=chat_body(priority=3), headers=headers)
    await client.post(CHAT, json=chat_body())
    first, second = list(sim.app.seen)[-2:]
    assert (first.request_id, first.batch, first.authorization) == ("rid-1", "batch_1", "Bearer k")
    assert first.has_priority and first.path == CHAT
    assert (second.request_id, second.batch, second.authorization) == (None, None, None)
    assert not second.has_priority


async def test_api_key_is_required_when_configured() -> None:
    async with SimServer(SimConfig(latency_ms=0, api_key="sk-up")) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as c:
            assert (await c.post(CHAT, json=chat_body())).status_code == 401
            bad = {"Authorization": "Bearer sk-other"}
            assert (await c.post(CHAT, json=chat_body(), headers=bad)).status_code == 401
            good = {"Authorization": "Bearer sk-up"}
            assert (await c.post(CHAT, json=chat_body(), headers=good)).status_code == 200


async def test_reply_bytes_pads_each_completion_to_that_size() -> None:
    config = SimConfig(model_names=[], latency_ms=0, reply_bytes=100_000)
    async with (
        SimServer(config) as server,
        httpx.AsyncClient(base_url=server.url, timeout=10) as c,
    ):
        chat = (await c.post(CHAT, json=chat_body())).json()
        assert len(chat["choices"][0]["message"]["content"]) == 100_000
        text = (await c.post("/v1/completions", json={"model": "m", "prompt": "hi"})).json()
        assert len(text["choices"][0]["text"]) == 100_000
