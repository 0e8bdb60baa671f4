"""backfill end to end against a real vLLM, as a user drives it with the `openai` SDK: batches of
each generation endpoint, the live proxy (`client.responses.stream()` included), and preemption
ending a batch line inside vLLM, not only at the gateway. Collected only by `make test-vllm`.

(The tiny Llama is a generation model: `/v1/embeddings` is left to the simulator's tests.)"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import httpx

from tests.polling import poll_until
from tests.vllm.preempting import (
    MODEL,
    cancel,
    live_stream,
    put_settings,
    tokens_for,
    vllm_stack,
    wait_ended,
    wait_preempted,
)
from tests.vllm.upstreams import SEATS, Upstream

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
            done = await wait_ended(client, batch_id, within=600)
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


LINE_SECONDS = 25.0
"""How long a batch line of the preemption test lasts, alone on vLLM (longer beside others): the
steps up to the preemption take about 5 s on a loaded 2-core machine."""


async def test_preemption_frees_vllms_seat(tmp_path: Path, dev_server: Any, vllm: Upstream) -> None:
    """A live request that needs a seat two long batch lines hold ends the youngest line: its
    connection closes, and vLLM stops generating it (its running count drops), so the seat is
    really free for the live request."""
    async with (
        vllm_stack(
            tmp_path, dev_server, vllm, cap=2, preempt_token="vllm-preempt-" + "v" * 32
        ) as stack,
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

        try:
            async with live_stream(client):
                await wait_preempted(stack, http, at_least=1)
                # The live stream and the one line left: the preempted line's generation ended
                # in vLLM (it kept running there if only the gateway had let go of it).
                await poll_until(
                    lambda: vllm.load(http),
                    lambda load: load[0] <= 2,
                    timeout=30,
                    what="vLLM running at most the live stream and one batch line",
                    interval=0.2,
                )
        finally:
            await cancel(client, batch.id)
        await wait_ended(client, batch.id, within=300)
        await poll_until(
            lambda: vllm.load(http),
            lambda load: load == (0, 0),
            timeout=60,
            what="vLLM idle once the batch is cancelled and the live stream gone",
            interval=0.2,
        )
