"""The simulator's prefix cache and continuations in GPU mode (tools.sim.prefix_cache,
tools.sim.gpu_reply): what the bench prices a resumed batch line with (decision 0036)."""

from __future__ import annotations

import json
from typing import Any

import httpx

from tools.sim import BATCH_HEADER, GpuConfig, SimConfig, SimServer
from tools.sim.gpu import GpuEngine, GpuSequence
from tools.sim.prefix_cache import PrefixCache, block_hashes

CHAT = "/v1/chat/completions"
FAST = GpuConfig(step_base_ms=2, step_per_seq_ms=0)
PROMPT = " ".join(f"w{i}" for i in range(30))
"""30 words: with 20 generated, 50 tokens, three whole blocks of 16."""


def test_blocks_are_named_by_their_whole_prefix() -> None:
    a = block_hashes([f"t{i}" for i in range(40)], 16)
    b = block_hashes(["x"] + [f"t{i}" for i in range(1, 40)], 16)
    assert len(a) == 2  # the partial last block has no name
    assert a[0] != b[0] and a[1] != b[1]  # a different first token changes every block after
    assert block_hashes([f"t{i}" for i in range(32)], 16) == a


def test_cached_prefix_is_whole_blocks_never_the_last_tokens_and_lru_evicts() -> None:
    cache = PrefixCache(block_size=4, capacity_blocks=3)
    first = [f"a{i}" for i in range(8)]
    assert cache.cached_prefix(first) == 0  # cold: all prefilled, its 2 blocks now cached
    # The whole prompt cached: its last token must be computed, and vLLM recomputes from a
    # block boundary, so its whole last block.
    assert cache.cached_prefix(first) == 4
    assert cache.cached_prefix([*first, "b0", "b1"]) == 8
    assert (cache.queries, cache.hits) == (26, 12)
    cache.keep([f"c{i}" for i in range(8)])  # 2 more blocks: the least recently used goes
    assert len(cache) == 3
    assert cache.peek(first) == 0  # its first block was evicted: nothing after it counts
    assert cache.peek([f"c{i}" for i in range(9)]) == 8


async def stream_tokens(
    http: httpx.AsyncClient, body: dict[str, Any], stop_after: int | None = None
) -> tuple[str, list[dict[str, Any]]]:
    """The content of a streamed batch request, and its events (closed after `stop_after`
    tokens: the simulator aborts it)."""
    text, events = "", []
    async with http.stream("POST", CHAT, json=body, headers={BATCH_HEADER: "b1"}) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            events.append(event)
            for c in event["choices"]:
                text += c["delta"].get("content") or ""
            if stop_after is not None and sum(1 for e in events if e["choices"]) >= stop_after:
                break
    return text, events


async def resumed(gpu: GpuConfig) -> dict[str, Any]:
    """A reply of 40 tokens, a stream of it closed after 20, then its continuation; what the
    simulator saw."""
    async with (
        SimServer(SimConfig(max_num_seqs=4, gpu=gpu)) as sim,
        httpx.AsyncClient(base_url=sim.url, timeout=30) as http,
    ):
        user = {"role": "user", "content": PROMPT}
        whole = await http.post(CHAT, json={"model": "demo", "messages": [user], "max_tokens": 40})
        uninterrupted = whole.json()["choices"][0]["message"]["content"]
        await http.post("/sim/latencies/reset")
        options = {"include_usage": True, "continuous_usage_stats": True}
        first = {"model": "demo", "messages": [user], "max_tokens": 40, "stream": True}
        partial, events = await stream_tokens(
            http, {**first, "stream_options": options}, stop_after=20
        )
        before = (await http.get("/sim/stats")).json()["gpu"]["prefix_cache"]
        rest, tail = await stream_tokens(
            http,
            {
                **first,
                "messages": [user, {"role": "assistant", "content": partial}],
                "continue_final_message": True,
                "add_generation_prompt": False,
                "max_tokens": 20,
                "stream_options": options,
            },
        )
        after = (await http.get("/sim/stats")).json()["gpu"]["prefix_cache"]
        lat = (await http.get("/sim/latencies")).json()
        return {
            "uninterrupted": uninterrupted,
            "partial": partial,
            "rest": rest,
            "events": events,
            "tail": tail,
            "hits": None if after is None else after["hits"] - before["hits"],
            "batch": lat["batch"],
        }


async def test_a_continued_reply_is_the_reply_uninterrupted_and_its_prefix_is_cached() -> None:
    seen = await resumed(FAST)
    assert seen["partial"] + seen["rest"] == seen["uninterrupted"]
    assert len(seen["partial"].split()) == 20
    # vLLM's continuous_usage_stats: every event counts the tokens so far.
    usage = [e["usage"] for e in seen["events"] if e["choices"]]
    assert [u["completion_tokens"] for u in usage] == list(range(1, 21))
    assert {u["prompt_tokens"] for u in usage} == {30}
    assert seen["tail"][-1]["usage"] == {
        "prompt_tokens": 50,  # the first prompt and the partial answer, as vLLM counts it
        "completion_tokens": 20,
        "total_tokens": 70,
    }
    # The continuation's prompt is the first prompt and the 20 tokens generated: its 3 whole
    # blocks were cached when the aborted request ended, so 48 of its 50 tokens are hits.
    assert seen["hits"] == 48
    # The 20 tokens sent back were kept, not thrown away (the aborted request may have made one
    # more than the client read before it closed).
    batch = seen["batch"]
    assert batch["aborted"] == 1 and batch["kept_tokens"] == 20
    assert batch["aborted_tokens"] - batch["kept_tokens"] <= 2


async def test_without_prefix_caching_a_continuation_prefills_everything() -> None:
    seen = await resumed(FAST.model_copy(update={"prefix_caching": False}))
    assert seen["partial"] + seen["rest"] == seen["uninterrupted"]
    assert seen["hits"] is None


async def test_a_continuation_is_matched_with_the_aborted_request_it_continues() -> None:
    """Same prompts (the bench's batch lines): the one whose generated count is closest above
    the partial answer's is taken, and only tokens counted since the log's reset are kept."""
    engine = GpuEngine(FAST, max_num_seqs=4, use_priority=False)
    earlier = engine.log.batch
    before_reset = GpuSequence(30, 128, traffic="batch", key=PROMPT, generated=122)
    before_reset.counted_in, before_reset.counted = earlier, 122
    engine.log.reset()
    now = engine.log.batch
    recent = GpuSequence(30, 128, traffic="batch", key=PROMPT, generated=21)
    recent.counted_in, recent.counted = now, 21
    engine._aborted[PROMPT] = [before_reset, recent]
    engine.submit(GpuSequence(50, 108, traffic="batch", key=PROMPT, continues=20))
    assert now.kept_tokens == 20  # not the older, longer one counted before the reset
    engine.submit(GpuSequence(140, 10, traffic="batch", key=PROMPT, continues=110))
    assert now.kept_tokens == 20  # its abort was before the reset: nothing counted to keep
    assert engine._aborted[PROMPT] == []
    # A continuation aborted in turn holds what it continued: the next continuation of it keeps
    # only its own tokens (20 continued, 5 made, 24 of the reply sent back: 4 kept).
    second = GpuSequence(50, 108, traffic="batch", key=PROMPT, continues=20, generated=5)
    second.counted_in, second.counted = now, 5
    engine._aborted[PROMPT] = [second]
    engine.submit(GpuSequence(54, 104, traffic="batch", key=PROMPT, continues=24))
    assert now.kept_tokens == 24
    await engine.stop()
