"""backfill end to end against a real vLLM, as a user drives it with the `openai` SDK: batches of
each generation endpoint, the live proxy (`client.responses.stream()` included), and preemption
ending a batch line inside vLLM, not only at the gateway. Collected only by `make test-vllm`.

(The tiny Llama is a generation model: `/v1/embeddings` is left to the simulator's tests.)"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest_asyncio

from tests.e2e.stack import auth, wait_terminal
from tests.e2e.test_live_gates import ADMIN, put_settings
from tests.polling import poll_until
from tests.vllm.conftest import VllmPool, idle_vllm
from tests.vllm.upstreams import LONG_TOKENS, SEATS, Upstream, VllmStack, long_body

MODEL = "demo"
"""The stack's model id; vLLM serves the tiny model under it too (`--served-model-name`)."""


@pytest_asyncio.fixture
async def vllm(vllm_pool: VllmPool | None) -> Upstream:
    assert vllm_pool is not None
    return await idle_vllm(vllm_pool, "fcfs")


@contextlib.asynccontextmanager
async def vllm_stack(
    tmp_path: Path, dev_server: Any, vllm: Upstream, **options: Any
) -> AsyncIterator[VllmStack]:
    stack = VllmStack(tmp_path, dev_server.address, vllm_url=vllm.url, **options)
    async with stack.running():
        yield stack


LINES = {
    "/v1/chat/completions": lambda i: {
        "messages": [{"role": "user", "content": f"hello {i}"}],
        "max_tokens": 16,
    },
    "/v1/completions": lambda i: {"prompt": f"hello {i}", "max_tokens": 16},
    "/v1/responses": lambda i: {"input": f"hello {i}", "max_output_tokens": 16},
}


def batch_input(endpoint: str, n: int) -> bytes:
    lines = [
        {
            "custom_id": f"line-{i}",
            "method": "POST",
            "url": endpoint,
            "body": {"model": MODEL, **LINES[endpoint](i)},
        }
        for i in range(n)
    ]
    return "".join(json.dumps(x) + "\n" for x in lines).encode()


async def test_batches_of_each_endpoint_complete_against_vllm(
    tmp_path: Path, dev_server: Any, vllm: Upstream
) -> None:
    n = 6
    async with vllm_stack(tmp_path, dev_server, vllm, cap=SEATS) as stack:
        client = stack.client()
        batches = {}
        for endpoint in LINES:
            f = await client.files.create(
                file=("in.jsonl", io.BytesIO(batch_input(endpoint, n))), purpose="batch"
            )
            batch = await client.batches.create(
                input_file_id=f.id,
                endpoint=endpoint,  # type: ignore[arg-type]
                completion_window="24h",
            )
            batches[endpoint] = batch.id
        for endpoint, batch_id in batches.items():
            done = await wait_terminal(client, batch_id, within=600)
            assert done.status == "completed", (endpoint, done)
            assert done.request_counts.completed == n and done.request_counts.failed == 0
            text = (await client.files.content(done.output_file_id)).text
            records = [json.loads(x) for x in text.splitlines()]  # as most users read it
            assert sorted(r["custom_id"] for r in records) == [f"line-{i}" for i in range(n)]
            for r in records:
                body = r["response"]["body"]
                assert r["response"]["status_code"] == 200
                tokens = body["usage"].get("completion_tokens", body["usage"].get("output_tokens"))
                assert 1 <= tokens <= 16, body["usage"]
            assert done.usage is not None and done.usage.output_tokens > 0


EIGHT = {"ignore_eos": True}
"""With the limit at 8 tokens, exactly 8: the tiny model's sampled end-of-sequence token (it can
come at any step) is ignored, so a count short of the limit is the gateway's fault."""


async def test_live_proxy_against_vllm_with_the_sdk(
    tmp_path: Path, dev_server: Any, vllm: Upstream
) -> None:
    async with vllm_stack(tmp_path, dev_server, vllm) as stack:
        oa = stack.client()
        chunks = []
        stream = await oa.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=EIGHT,
        )
        async for chunk in stream:
            chunks.append(chunk)
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8
        whole = await oa.responses.create(
            model=MODEL, input="hi", max_output_tokens=8, extra_body=EIGHT
        )
        assert whole.usage is not None and whole.usage.output_tokens == 8
        text = ""
        async with oa.responses.stream(
            model=MODEL, input="hi", max_output_tokens=8, extra_body=EIGHT
        ) as s:
            async for event in s:
                if event.type == "response.output_text.delta":
                    text += event.delta
            final = await s.get_final_response()
        assert final.output_text == text and final.usage is not None
        assert final.usage.output_tokens == 8


async def scheduling_or_busy(stack: VllmStack, http: httpx.AsyncClient) -> dict[str, Any] | None:
    """The route's scheduling status, or None while the endpoint answers its documented 503
    `temporal_unavailable` (the scheduler's query unanswered in time: "Workflow is busy" on a
    loaded machine, seen in a clean-clone run); any other answer fails as `scheduling` does."""
    url = f"{stack.api_url}/api/v1/platform/deployments/{stack.route_id}/batch-scheduling"
    resp = await http.get(url, headers=auth(ADMIN))
    if resp.status_code == 503 and resp.json()["error"]["code"] == "temporal_unavailable":
        return None
    assert resp.status_code == 200, resp.text
    return resp.json()  # type: ignore[no-any-return]


LINE_SECONDS = 25.0
"""How long a batch line of the preemption test lasts, alone on vLLM (longer beside others): the
steps up to the preemption take about 5 s on a loaded 2-core machine."""


async def tokens_for(vllm: Upstream, http: httpx.AsyncClient, seconds: float) -> int:
    """How many tokens vLLM makes in about `seconds` for one sequence, measured now (the faster of
    two samples, so a moment's load elsewhere does not make the lines short): the same count lasts
    a second on an idle fast CPU and a minute on a loaded slow one."""
    sample = 128
    took = []
    for _ in range(2):
        started = time.monotonic()
        r = await http.post(
            f"{vllm.base_url}/chat/completions",
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": "pace"}],
                "max_tokens": sample,
                "ignore_eos": True,
            },
        )
        took.append(time.monotonic() - started)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == sample, r.json()["usage"]
    return min(LONG_TOKENS, max(sample, round(sample * seconds / min(took))))


async def test_preemption_frees_vllms_seat(tmp_path: Path, dev_server: Any, vllm: Upstream) -> None:
    """A live request that needs a seat two long batch lines hold ends the youngest line: its
    connection closes, and vLLM stops generating it (its running count drops), so the seat is
    really free for the live request."""
    async with (
        vllm_stack(tmp_path, dev_server, vllm, cap=2, preempt_token="vllm-preempt") as stack,
        httpx.AsyncClient(timeout=60) as http,
    ):
        settings: dict[str, Any] = {
            "max_concurrent_lines": 2,
            "seat_aware": {"seats": 3, "keep_free": 1},
            "preempt": {"max_preemptions": 100},
        }
        await put_settings(stack, http, settings)
        client = stack.client()
        # A batch line must run through the steps below whatever the CPU, yet end once the
        # batch is cancelled (its running lines finish): about LINE_SECONDS on this vLLM now.
        line = {"max_tokens": await tokens_for(vllm, http, LINE_SECONDS), "ignore_eos": True}
        lines = [
            {
                "custom_id": f"long-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": f"long {i}"}],
                    **line,
                },
            }
            for i in range(20)  # more than run before the api reads its policy (every 5 s)
        ]
        f = await client.files.create(
            file=("in.jsonl", io.BytesIO("".join(json.dumps(x) + "\n" for x in lines).encode())),
            purpose="batch",
        )
        batch = await client.batches.create(
            input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        await poll_until(
            lambda: vllm.load(http),
            lambda load: load[0] == 2,
            timeout=120,
            what="two batch lines running in vLLM",
            interval=0.2,
        )

        async def live_traffic() -> None:
            """One long live stream in flight at a time, until cancelled."""
            while True:
                stream = await client.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": "live"}],
                    stream=True,
                    extra_body=long_body(),  # ended by the test (its client leaves)
                )
                async for _ in stream:
                    pass

        live = asyncio.ensure_future(live_traffic())
        try:
            await poll_until(
                lambda: scheduling_or_busy(stack, http),
                lambda d: d is not None and d["status"]["preempted_lines"] > 0,
                timeout=60,
                what="a batch line preempted for the live stream",
                interval=0.2,
            )
            # The live stream and the one line left: the preempted line's generation ended in
            # vLLM (it kept running there if only the gateway had let go of it).
            await poll_until(
                lambda: vllm.load(http),
                lambda load: load[0] <= 2,
                timeout=30,
                what="vLLM running at most the live stream and one batch line",
                interval=0.2,
            )
        finally:
            live.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await live
            await client.batches.cancel(batch.id)
        await wait_terminal(client, batch.id, within=300)
        await poll_until(
            lambda: vllm.load(http),
            lambda load: load == (0, 0),
            timeout=60,
            what="vLLM idle once the batch is cancelled and the live stream gone",
            interval=0.2,
        )
