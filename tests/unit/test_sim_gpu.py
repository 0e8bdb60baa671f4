"""The simulator's GPU mode (tools.sim.gpu), driven over real loopback HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tools.dev.procs import free_port
from tools.sim import BATCH_HEADER, GpuConfig, SimConfig, SimServer
from tools.sim.gpu import FINISHED, GpuEngine, GpuSequence, percentile

ROOT = Path(__file__).resolve().parents[2]
CHAT = "/v1/chat/completions"
SLOW = GpuConfig(step_base_ms=5000, step_per_seq_ms=0, prefill_per_token_ms=0)
"""Steps so slow that the state cannot change while a test looks at it."""


def body(words: int = 4, **extra: Any) -> dict[str, Any]:
    content = " ".join(f"w{i}" for i in range(words))
    return {"model": "demo", "messages": [{"role": "user", "content": content}], **extra}


def gpu_sim(gpu: GpuConfig, max_num_seqs: int = 4, **extra: Any) -> SimServer:
    return SimServer(SimConfig(max_num_seqs=max_num_seqs, gpu=gpu, **extra))


@pytest.fixture
async def client_for() -> AsyncIterator[Callable[[SimServer], httpx.AsyncClient]]:
    clients: list[httpx.AsyncClient] = []

    def make(sim: SimServer) -> httpx.AsyncClient:
        clients.append(httpx.AsyncClient(base_url=sim.url, timeout=30))
        return clients[-1]

    yield make
    for c in clients:
        await c.aclose()


async def gauges(c: httpx.AsyncClient) -> dict[str, float]:
    text = (await c.get("/metrics")).text
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if fam.type == "gauge":
                assert s.labels == {"engine": "0", "model_name": "demo"}
                out[s.name] = s.value
    return out


async def until(c: httpx.AsyncClient, pred: Callable[[dict[str, float]], bool]) -> dict:
    """Scrape /metrics (one loopback round trip each) until pred holds, within 10 s."""
    deadline = time.monotonic() + 10
    while not pred(g := await gauges(c)):
        assert time.monotonic() < deadline, f"never held: {g}"
    return g


async def latencies(c: httpx.AsyncClient) -> dict[str, Any]:
    r = await c.get("/sim/latencies")
    assert r.status_code == 200
    return r.json()  # type: ignore[no-any-return]


async def cancel_all(tasks: list[asyncio.Task[Any]]) -> None:
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_max_num_seqs_caps_running_the_rest_wait_and_gauges_match(
    client_for: Callable[[SimServer], httpx.AsyncClient],
) -> None:
    gpu = SLOW.model_copy(update={"kv_cache_tokens": 1000})
    async with gpu_sim(gpu, max_num_seqs=2) as sim:
        c = client_for(sim)
        tasks = [asyncio.create_task(c.post(CHAT, json=body(words=5))) for _ in range(5)]
        g = await until(c, lambda g: g["vllm:num_requests_waiting"] == 3)
        assert g["vllm:num_requests_running"] == 2
        # The first step has not ended: each running sequence holds its 5 prompt tokens.
        assert g["vllm:kv_cache_usage_perc"] == pytest.approx(10 / 1000)
        stats = (await c.get("/sim/stats")).json()
        assert (stats["running"], stats["waiting"], stats["peak_running"]) == (2, 3, 2)
        assert stats["gpu"]["kv_cache_tokens_held"] == 10
        await cancel_all(tasks)  # the clients leave: seats and cache are freed at once
        g = await until(c, lambda g: g["vllm:num_requests_running"] == 0)
        assert g == {
            "vllm:num_requests_running": 0,
            "vllm:num_requests_waiting": 0,
            "vllm:kv_cache_usage_perc": 0,
        }
        assert (await latencies(c))["live"]["aborted"] == 5


async def test_kv_budget_blocks_admission(
    client_for: Callable[[SimServer], httpx.AsyncClient],
) -> None:
    gpu = SLOW.model_copy(update={"kv_cache_tokens": 30})
    async with gpu_sim(gpu, max_num_seqs=8) as sim:
        c = client_for(sim)
        # 4 prompt + 10 completion tokens = 14 reserved: two fit in 30, the third waits.
        tasks = [asyncio.create_task(c.post(CHAT, json=body(max_tokens=10))) for _ in range(3)]
        g = await until(
            c, lambda g: g["vllm:num_requests_running"] + g["vllm:num_requests_waiting"] == 3
        )
        assert (g["vllm:num_requests_running"], g["vllm:num_requests_waiting"]) == (2, 1)
        assert g["vllm:kv_cache_usage_perc"] == pytest.approx(8 / 30)
        too_long = await c.post(CHAT, json=body(max_tokens=27))  # 31 > 30: could never fit
        assert too_long.status_code == 400
        assert too_long.json()["error"]["type"] == "BadRequestError"
        await cancel_all(tasks)


async def test_kv_budget_admits_the_waiter_when_a_sequence_finishes(
    client_for: Callable[[SimServer], httpx.AsyncClient],
) -> None:
    gpu = GpuConfig(step_base_ms=10, step_per_seq_ms=0, kv_cache_tokens=20)
    async with gpu_sim(gpu, max_num_seqs=8) as sim:
        c = client_for(sim)
        rs = await asyncio.gather(*(c.post(CHAT, json=body(max_tokens=10)) for _ in range(3)))
        assert [r.status_code for r in rs] == [200, 200, 200]
        s = (await c.get("/sim/stats")).json()
        assert s["peak_running"] == 1 and s["peak_waiting"] >= 1  # 14 + 14 > 20: one at a time
        assert s["gpu"]["steps"] == 30


@pytest.mark.parametrize(
    ("policy", "expected"), [("priority", ["c", "d", "b"]), ("fcfs", ["b", "c", "d"])]
)
async def test_waiting_order_under_contention(
    client_for: Callable[[SimServer], httpx.AsyncClient], policy: str, expected: list[str]
) -> None:
    gpu = GpuConfig(step_base_ms=10, step_per_seq_ms=0)
    async with gpu_sim(gpu, max_num_seqs=1, scheduling_policy=policy) as sim:
        c = client_for(sim)
        hog = asyncio.create_task(c.post(CHAT, json=body(max_tokens=100_000 // 2)))
        await until(c, lambda g: g["vllm:num_requests_running"] == 1)
        done: list[str] = []

        async def one(name: str, priority: int) -> None:
            r = await c.post(CHAT, json=body(max_tokens=2, priority=priority))
            assert r.status_code == 200
            done.append(name)

        tasks = []
        for queued, (name, prio) in enumerate([("b", 5), ("c", 1), ("d", 3)], start=1):
            tasks.append(asyncio.create_task(one(name, prio)))
            await until(c, lambda g, q=queued: g["vllm:num_requests_waiting"] == q)  # type: ignore[misc]
        assert done == []
        await cancel_all([hog])  # the hog's client leaves; the queue drains one at a time
        await asyncio.gather(*tasks)
        assert done == expected


async def test_step_time_grows_with_the_running_batch() -> None:
    gpu = GpuConfig(step_base_ms=5, step_per_seq_ms=20, prefill_per_token_ms=0)
    engine = GpuEngine(gpu, max_num_seqs=8, use_priority=False)
    assert engine.step_ms(1) == 25 and engine.step_ms(6) == 125
    assert GpuEngine(GpuConfig(prefill_per_token_ms=0.5), 8, False).step_ms(2, 100) == 72

    async def run(n: int) -> float:
        seqs = [GpuSequence(prompt_tokens=4, max_new=6) for _ in range(n)]
        t0 = time.monotonic()
        for seq in seqs:  # in one tick: all start in the same step
            engine.submit(seq)
        for seq in seqs:
            while await seq.tokens.get() is not FINISHED:
                pass
        return time.monotonic() - t0

    single = await run(1)
    assert (engine.steps, engine.busy_s) == (6, pytest.approx(6 * 0.025))
    assert single >= 0.15
    six = await run(6)
    assert (engine.steps, engine.busy_s) == (12, pytest.approx(0.15 + 6 * 0.125))
    assert six >= 0.75 and engine.peak_running == 6
    records = engine.log.records
    assert [r.completion_tokens for r in records] == [6] * 7
    assert min(r.e2e_s for r in records[1:]) >= 0.75


async def test_aborted_requests_count_the_tokens_they_had_generated() -> None:
    """What a preempted batch request wastes: the tokens it had when its client left, per class;
    a request that finishes wastes nothing."""
    engine = GpuEngine(GpuConfig(step_base_ms=5, step_per_seq_ms=0), 4, use_priority=False)
    batch = GpuSequence(prompt_tokens=4, max_new=10_000, traffic="batch")
    done = GpuSequence(prompt_tokens=4, max_new=3, traffic="batch")
    live = GpuSequence(prompt_tokens=4, max_new=10_000)
    for seq in (batch, done, live):
        engine.submit(seq)
    for _ in range(5):
        await batch.tokens.get()
    engine.abort(batch)
    engine.abort(live)
    assert engine.log.batch.aborted_tokens == batch.generated >= 5
    assert engine.log.live.aborted_tokens == live.generated >= 5
    while await done.tokens.get() is not FINISHED:
        pass
    engine.abort(done)  # finished already: a no-op
    assert engine.log.batch.aborted_tokens == batch.generated
    assert engine.log.batch.generated_tokens == batch.generated + 3
    assert engine.log.summary()["batch"]["aborted_tokens"] == batch.generated
    # Across a reset, only the tokens generated since count (a measurement window's waste).
    long = GpuSequence(prompt_tokens=4, max_new=10_000, traffic="batch")
    engine.submit(long)
    for _ in range(3):
        await long.tokens.get()
    engine.log.reset()
    while engine.log.batch.generated_tokens < 2:
        await long.tokens.get()
    engine.abort(long)
    assert long.generated >= 5
    assert engine.log.batch.aborted_tokens == engine.log.batch.generated_tokens >= 2
    assert engine.log.batch.aborted_tokens <= long.generated - 3
    await engine.stop()


async def test_step_time_over_http(client_for: Callable[[SimServer], httpx.AsyncClient]) -> None:
    gpu = GpuConfig(step_base_ms=5, step_per_seq_ms=20, prefill_per_token_ms=0)
    async with gpu_sim(gpu, max_num_seqs=8) as sim:
        c = client_for(sim)
        assert (await c.post(CHAT, json=body(max_tokens=6))).status_code == 200
        single = (await latencies(c))["live"]["e2e_ms"]["max"]
        assert (await c.post("/sim/latencies/reset")).status_code == 200
        rs = await asyncio.gather(*(c.post(CHAT, json=body(max_tokens=6)) for _ in range(6)))
        assert all(r.status_code == 200 for r in rs)
        lat = (await latencies(c))["live"]
        # However the six arrived, the last one's six steps each ran a batch of several.
        assert lat["finished"] == 6 and lat["e2e_ms"]["max"] > single
        s = (await c.get("/sim/stats")).json()
        assert s["peak_running"] >= 2 and s["gpu"]["busy_s"] > 0.15 + 6 * 0.025 * 2


async def test_prefill_cost_grows_with_prompt_length(
    client_for: Callable[[SimServer], httpx.AsyncClient],
) -> None:
    gpu = GpuConfig(step_base_ms=5, step_per_seq_ms=0, prefill_per_token_ms=1)
    async with gpu_sim(gpu) as sim:
        c = client_for(sim)
        assert (await c.post(CHAT, json=body(words=300, max_tokens=1))).status_code == 200
        lat = await latencies(c)
        assert lat["live"]["ttft_ms"]["p50"] >= 305  # one step: 5 ms + 300 prompt tokens × 1 ms
        assert lat["live"]["prompt_tokens"] == 300


async def test_ttft_and_e2e_recorded_per_class_with_priority_seen(
    client_for: Callable[[SimServer], httpx.AsyncClient],
) -> None:
    gpu = GpuConfig(step_base_ms=10, step_per_seq_ms=1)
    async with gpu_sim(gpu, scheduling_policy="priority") as sim:
        c = client_for(sim)
        batch = {BATCH_HEADER: "batch_1"}
        reqs = [c.post(CHAT, json=body(max_tokens=3)) for _ in range(2)]
        reqs += [
            c.post(CHAT, json=body(max_tokens=5, priority=10), headers=batch) for _ in range(3)
        ]
        rs = await asyncio.gather(*reqs)
        assert all(r.status_code == 200 for r in rs)
        lat = await latencies(c)
        live, bat = lat["live"], lat["batch"]
        assert (live["finished"], bat["finished"]) == (2, 3)
        assert (live["completion_tokens"], bat["completion_tokens"]) == (6, 15)
        assert (live["generated_tokens"], bat["generated_tokens"]) == (6, 15)
        assert (live["with_priority"], bat["with_priority"]) == (0, 3)
        for cls in (live, bat):
            assert 10 <= cls["ttft_ms"]["p50"] <= cls["e2e_ms"]["p50"]
            assert cls["ttft_ms"]["p99"] <= cls["e2e_ms"]["p99"]
        assert bat["e2e_ms"]["p50"] >= 50  # five steps of at least 10 ms
        records = sim.app.engine.log.records  # type: ignore[union-attr]
        assert sorted((r.traffic, r.priority) for r in records)[0] == ("batch", 10)
        assert (await c.post("/sim/latencies/reset")).json()["live"]["finished"] == 0


async def test_streaming_tokens_arrive_as_steps_complete(
    client_for: Callable[[SimServer], httpx.AsyncClient],
) -> None:
    gpu = GpuConfig(step_base_ms=200, step_per_seq_ms=0, prefill_per_token_ms=0)
    async with gpu_sim(gpu) as sim:
        c = client_for(sim)
        engine = sim.app.engine
        assert engine is not None
        seen: list[tuple[str, int]] = []  # (content, tokens generated by then)
        payload = body(max_tokens=4, stream=True, stream_options={"include_usage": True})
        t0 = time.monotonic()
        async with c.stream("POST", CHAT, json=payload) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                event = json.loads(line[6:])
                if event["choices"] and event["choices"][0]["delta"].get("content"):
                    seen.append((event["choices"][0]["delta"]["content"], engine.running))
                elif not event["choices"]:
                    assert event["usage"]["completion_tokens"] == 4
        assert time.monotonic() - t0 >= 0.8
        assert "".join(t for t, _ in seen) == "Simulated w0 w1 w2"
        # The first three tokens were read while the sequence was still running: not buffered.
        assert [running for _, running in seen[:3]] == [1, 1, 1]


async def test_openai_sdk_and_embeddings_in_gpu_mode() -> None:
    async with (
        gpu_sim(GpuConfig(step_base_ms=1, default_output_tokens=5)) as sim,
        openai.AsyncOpenAI(base_url=sim.base_url, api_key="x", max_retries=0) as oa,
    ):
        cc = await oa.chat.completions.create(model="demo", messages=body()["messages"])
        assert cc.choices[0].message.content == "Simulated w0 w1 w2 w3"
        assert cc.choices[0].finish_reason == "stop"
        assert cc.usage is not None and (cc.usage.prompt_tokens, cc.usage.completion_tokens) == (
            4,
            5,
        )
        stream = await oa.chat.completions.create(
            model="demo", messages=body()["messages"], stream=True, max_tokens=7
        )
        chunks = [ch async for ch in stream]
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        assert text == "Simulated w0 w1 w2 w3 Simulated w0"
        assert chunks[-1].choices[0].finish_reason == "length"
        comp = await oa.completions.create(model="demo", prompt=["a", "b c"], max_tokens=2, n=2)
        assert [c.text for c in comp.choices] == ["Simulated a"] * 2 + ["Simulated b"] * 2
        emb = await oa.embeddings.create(model="demo", input="hi there")
        assert len(emb.data[0].embedding) == 16 and emb.usage.prompt_tokens == 2


def test_percentile_nearest_rank() -> None:
    assert percentile([], 50) is None
    assert percentile([3, 1, 2], 50) == 2
    assert percentile(range(1, 101), 99) == 99
    assert percentile([5], 99) == 5


async def test_client_leaving_mid_stream_frees_its_seat_and_cache(
    client_for: Callable[[SimServer], httpx.AsyncClient],
) -> None:
    async with gpu_sim(GpuConfig(step_base_ms=20, step_per_seq_ms=0)) as sim:
        c = client_for(sim)
        payload = body(max_tokens=10_000, stream=True)
        async with c.stream("POST", CHAT, json=payload) as r:
            async for line in r.aiter_lines():
                if '"content"' in line:
                    break  # one token read, then the client leaves
        g = await until(c, lambda g: g["vllm:num_requests_running"] == 0)
        assert g["vllm:kv_cache_usage_perc"] == 0
        lat = await latencies(c)
        assert (lat["live"]["aborted"], lat["live"]["finished"]) == (1, 0)
        assert 1 <= lat["live"]["generated_tokens"] < 10_000
        assert lat["live"]["aborted_tokens"] == lat["live"]["generated_tokens"]


async def test_latencies_endpoint_needs_gpu_mode() -> None:
    async with SimServer(SimConfig(latency_ms=0)) as sim, httpx.AsyncClient(base_url=sim.url) as c:
        r = await c.get("/sim/latencies")
        assert r.status_code == 404 and r.json()["error"]["type"] == "NotFoundError"
        assert "gpu" not in (await c.get("/sim/stats")).json()


async def test_cli_gpu_flags() -> None:
    port = free_port()
    code = "import sys; from tools.sim import main; sys.exit(main(sys.argv[1:]))"
    args = ["--port", str(port), "--gpu", "--max-num-seqs", "2", "--step-base-ms", "30"]
    args += ["--step-per-seq-ms", "0", "--kv-cache-tokens", "50", "--log-level", "warning"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", code, *args, env=env)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as c:
            deadline = time.monotonic() + 20
            while True:
                try:
                    await c.get("/health")
                    break
                except httpx.TransportError:
                    assert proc.returncode is None and time.monotonic() < deadline
                    await asyncio.sleep(0.05)  # waiting for a child process to boot
            assert (await c.post(CHAT, json=body(max_tokens=47))).status_code == 400  # 51 > 50
            ok = await c.post(CHAT, json=body(max_tokens=3), headers={BATCH_HEADER: "b"})
            assert ok.status_code == 200
            lat = await latencies(c)
            assert lat["batch"]["finished"] == 1 and lat["batch"]["e2e_ms"]["p50"] >= 90
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 10) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_batch_client_leaving_before_the_answer_gives_its_seat_to_a_waiting_request(
    client_for: Callable[[SimServer], httpx.AsyncClient],
) -> None:
    """A non-streamed batch line whose client closes the connection (a preempted line) is
    aborted: its seat goes to the waiting live request at the next step, and the abort's time
    is reported."""
    step_ms = 50
    async with gpu_sim(GpuConfig(step_base_ms=step_ms, step_per_seq_ms=0), max_num_seqs=1) as sim:
        c = client_for(sim)
        batch = asyncio.create_task(
            c.post(CHAT, json=body(max_tokens=10_000), headers={BATCH_HEADER: "batch_1"})
        )
        await until(c, lambda g: g["vllm:num_requests_running"] == 1)
        live = asyncio.create_task(c.post(CHAT, json=body(max_tokens=2)))
        await until(c, lambda g: g["vllm:num_requests_waiting"] == 1)
        left = time.monotonic()
        await cancel_all([batch])  # the connection closes before any byte of the answer
        assert (await live).status_code == 200
        lat = await latencies(c)
        assert (lat["batch"]["aborted"], lat["batch"]["finished"]) == (1, 0)
        assert lat["batch"]["generated_tokens"] < 10_000
        assert lat["batch"]["aborted_tokens"] == lat["batch"]["generated_tokens"]
        assert lat["live"]["aborted_tokens"] == 0 and lat["live"]["generated_tokens"] == 2
        [aborted_at] = lat["batch"]["aborted_at"]
        assert left <= aborted_at < left + 1.0
        # Admitted at the first step after the abort, not after the batch line's 500 s.
        assert lat["live"]["finished"] == 1
        assert lat["live"]["queued_ms"]["max"] < 2_000
