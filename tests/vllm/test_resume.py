"""A preempted batch line resumes against a real vLLM (decision 0036): preempted three times by a
live stream, it keeps what it generated each time and its next run continues it
(`continue_final_message`), so it ends with exactly `max_tokens` completion tokens, one record,
one `id`, and content that starts with each partial answer. Collected only by `make test-vllm`.

With `temperature: 0` and `ignore_eos` the resumed answer is compared with vLLM's uninterrupted
greedy answer to the same line; the share that matches is printed, not asserted: a continuation
is prefilled from the partial answer's text, which the tokenizer may split into other tokens than
the ones generated (a byte-level BPE re-tokenizes the decoded text), and a prefill computes its
logits with other kernels and batch shapes than the decode steps it replaces, so a near tie
between two tokens can go the other way (on a random-weight model, many are near ties)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from backfill.batches.streamed_answer import Partial
from tests.polling import poll_until
from tests.vllm.preempting import (
    MODEL,
    cancel,
    counted,
    counter,
    live_stream,
    put_settings,
    tokens_for,
    vllm_stack,
    wait_ended,
    wait_preempted,
)
from tests.vllm.upstreams import Upstream, VllmStack

PREEMPTIONS = 3
LINE_SECONDS = 60.0
"""How long the line lasts alone on vLLM at the pace measured before it: the three preemptions
and the resumes between them take about 5 s each on a loaded 2-core machine."""
NEW_TOKENS = 16
"""Tokens vLLM generates while the line's run is in it before the next preemption (its
counter: a live stream still being aborted as the continuation starts may make a few)."""
GENERATED, PROMPTS = "vllm:generation_tokens", "vllm:prompt_tokens"
MOST_TOKENS = 16384
"""The line's `max_tokens` at most: room in the context (`MAX_MODEL_LEN`, 32768) for its last
continuation's prompt, which holds the partial answer re-tokenized from its text, up to 3 tokens
per token generated (a random-weight model emits byte tokens that decode to U+FFFD, 3 bytes):
room for a last preemption up to about 8,000 tokens in (it comes after a few hundred to a few
thousand). vLLM lowers a `max_tokens` that does not fit beside the prompt to what does: an
answer resumed near the context's end can be shorter than the one sent without interruption."""
GREEDY = {"temperature": 0, "ignore_eos": True}


async def prefix_cache(vllm: Upstream, http: httpx.AsyncClient) -> tuple[float, float] | None:
    """vLLM's prefix-cache (queries, hits) in tokens, None if it does not count them."""
    try:
        return (
            await counter(vllm, http, "vllm:prefix_cache_queries"),
            await counter(vllm, http, "vllm:prefix_cache_hits"),
        )
    except AssertionError:
        return None


def common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


async def partial(stack: VllmStack, batch_id: str) -> Partial:
    data = stack.store().get_partial(batch_id, 0)
    assert data is not None, "a preempted streamed line keeps its partial answer"
    return Partial.model_validate_json(data)


async def test_a_line_preempted_three_times_resumes_and_keeps_its_tokens(
    tmp_path: Path, dev_server: Any, vllm: Upstream, capsys: pytest.CaptureFixture[str]
) -> None:
    async with (
        vllm_stack(
            tmp_path, dev_server, vllm, cap=1, preempt_token="vllm-preempt-" + "v" * 32
        ) as stack,
        httpx.AsyncClient(timeout=120) as http,
    ):
        # One batch seat while no live request runs, none while one does: each live stream
        # preempts the line, and its end lets the line continue.
        await put_settings(
            stack,
            http,
            {
                "max_concurrent_lines": 1,
                "seat_aware": {"seats": 2, "keep_free": 1},
                "preempt": {"max_preemptions": 100},  # resume: on by default
            },
        )
        client = stack.client()
        limit = min(MOST_TOKENS, await tokens_for(vllm, http, LINE_SECONDS))
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Tell me everything, at length."}],
            "max_tokens": limit,
            **GREEDY,
        }
        direct = await http.post(f"{vllm.base_url}/chat/completions", json=body)
        assert direct.status_code == 200, direct.text
        greedy = direct.json()
        line = {"custom_id": "resumed", "method": "POST", "url": "/v1/chat/completions"}
        f = await client.files.create(
            file=("in.jsonl", io.BytesIO((json.dumps({**line, "body": body}) + "\n").encode())),
            purpose="batch",
        )
        batch = await client.batches.create(
            input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        partials: list[Partial] = []
        statuses: list[dict[str, Any]] = []
        cache_before = await prefix_cache(vllm, http)
        try:
            await poll_until(
                lambda: vllm.load(http),
                lambda load: load[0] == 1,
                timeout=120,
                what="the batch line running in vLLM",
                interval=0.2,
            )
            for k in range(1, PREEMPTIONS + 1):
                # The line's run (the first, or a continuation: its prompt holds the partial
                # answer) generates a few tokens of its own before the next live stream.
                start = await counter(vllm, http, GENERATED)
                await counted(vllm, http, GENERATED, start + NEW_TOKENS, f"run {k} generating")
                async with live_stream(client):
                    statuses.append(await wait_preempted(stack, http, at_least=k, within=120))
                    partials.append(await partial(stack, batch.id))
                    prompts = await counter(vllm, http, PROMPTS)
                if k < PREEMPTIONS:  # its continuation was prefilled: the line runs again
                    what = f"the continuation of run {k} prefilled"
                    await counted(
                        vllm, http, PROMPTS, prompts + partials[-1].completion_tokens, what
                    )
        except BaseException:
            await cancel(client, batch.id)
            raise
        done = await wait_ended(client, batch.id, within=900)
        cache_after = await prefix_cache(vllm, http)
        assert done.status == "completed", done
        assert done.request_counts.completed == 1
        text = (await client.files.content(done.output_file_id)).text

    # One record, the line's, parsed by the SDK as a chat completion.
    [record] = [json.loads(x) for x in text.splitlines()]
    assert record["custom_id"] == "resumed" and record["response"]["status_code"] == 200
    answer = openai.types.chat.ChatCompletion.model_validate(record["response"]["body"])
    content = answer.choices[0].message.content or ""
    # How far the resumed answer is vLLM's uninterrupted greedy one (reported, not asserted).
    reference = greedy["choices"][0]["message"]["content"]
    same = common_prefix(content, reference)
    texts = [p.text for p in partials]
    counts = [p.completion_tokens for p in partials]
    resumes = [len(t) for t in texts]
    replaced = (content.count("\ufffd"), reference.count("\ufffd"))
    where = "none" if same == len(reference) else f"at character {same}"
    report = (
        f"\nresumed vs uninterrupted greedy answer: {same} of {len(reference)} characters match "
        f"({100 * same / max(1, len(reference)):.1f} %), first difference {where}; the runs "
        f"resumed at characters {resumes} (tokens {counts} of {limit}); U+FFFD in the "
        f"resumed answer {replaced[0]}, in the uninterrupted one {replaced[1]}"
    )
    if cache_before is not None and cache_after is not None:
        queries, hits = (a - b for a, b in zip(cache_after, cache_before, strict=True))
        report += f"\nvLLM prefix cache over the line's runs and the live streams: {hits:.0f} "
        report += f"of {queries:.0f} prompt tokens hit"
    with capsys.disabled():  # shown by make test-vllm (-q), before the checks
        print(report)

    # Each partial answer grew from the one before, and the answer starts with every one of them.
    assert all(a < b for a, b in zip(counts, counts[1:], strict=False)), counts
    assert all(content.startswith(t) for t in texts), (texts, content[:200])
    # One answer: the first run's id, exactly max_tokens completion tokens over the 4 runs, the
    # prompt billed once (the first request's), finished by its length.
    assert answer.id == partials[0].head["id"]
    assert answer.usage is not None
    assert answer.usage.completion_tokens == limit
    assert answer.usage.prompt_tokens == greedy["usage"]["prompt_tokens"]
    assert answer.choices[0].finish_reason == "length"
    # Nothing thrown away; what the resumed runs sent again as prompt is counted for the route.
    assert [s["wasted_tokens"] for s in statuses] == [0] * PREEMPTIONS
    assert statuses[-1]["reprefill_tokens"] >= sum(
        greedy["usage"]["prompt_tokens"] + n for n in counts[:-1]
    )
    [route] = done.model_extra["backfill"]["routes"]  # type: ignore[index]
    assert (route["preempted_lines"], route["wasted_tokens"]) == (PREEMPTIONS, 0)
    assert route["reprefill_tokens"] == sum(greedy["usage"]["prompt_tokens"] + n for n in counts)
