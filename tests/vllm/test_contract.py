"""The model-server contract backfill relies on, run against the simulator and a real vLLM
(`make test-vllm`; plain `make test` runs the simulator's half), so the simulator cannot drift
from the engine its gates and benches stand in for."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from backfill.upstream.load_metrics import parse_load
from tests.polling import poll_until
from tests.vllm.upstreams import MAX_MODEL_LEN, MODEL, SEATS, Upstream

LONG_PROMPT = " ".join(f"w{i}" for i in range(20))
"""20 words: the simulator's reply repeats at most 16 of them, one a second under `slow()`."""


def chat(content: str = "hello there", **body: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **body}


async def sse(resp: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """The JSON events of a server-sent event stream, up to `[DONE]`. Lines end at "\n" only:
    vLLM writes non-ASCII unescaped, and the random-weight model's text can hold U+0085 or
    U+2028, where httpx's `aiter_lines` (str.splitlines) would cut an event in two."""
    buffer = ""
    async for text in resp.aiter_text():
        buffer += text
        *lines, buffer = buffer.split("\n")
        for line in lines:
            line = line.rstrip("\r")
            if not line.startswith("data: "):
                continue
            data = line[len("data: ") :]
            if data == "[DONE]":
                return
            yield json.loads(data)
    tail = buffer.rstrip("\r")
    if tail.startswith("data: ") and tail != "data: [DONE]":
        yield json.loads(tail[len("data: ") :])


async def test_metrics_the_gates_read_have_their_names_and_types(upstream: Upstream) -> None:
    async with httpx.AsyncClient(timeout=120) as http:
        r = await http.post(f"{upstream.base_url}/chat/completions", json=chat(max_tokens=4))
        assert r.status_code == 200, r.text
        text = (await http.get(f"{upstream.url}/metrics")).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
        assert families[name].type == "gauge", name
    assert families["vllm:kv_cache_usage_perc"].type == "gauge"
    success = families["vllm:request_success"]
    assert success.type == "counter"
    reasons = {s.labels.get("finished_reason") for s in success.samples}
    assert {"stop", "length"} <= reasons, reasons
    labels = families["vllm:num_requests_running"].samples[0].labels
    assert labels.get("model_name") == MODEL, labels
    reading = parse_load(text, 0)
    assert reading.error is None
    assert reading.running == 0 and reading.waiting == 0
    assert reading.kv_cache_percent is not None and 0 <= reading.kv_cache_percent <= 100


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_request_whose_client_leaves_is_aborted(upstream: Upstream, stream: bool) -> None:
    """backfill ends a batch line by closing its connection (preemption, cancel, timeout): the
    server must stop generating and free the seat, streamed or not."""
    body = chat(LONG_PROMPT, stream=stream, **upstream.long_body())
    async with httpx.AsyncClient(timeout=60) as probe:
        with upstream.slow():
            leaver = httpx.AsyncClient(timeout=300)
            request = asyncio.ensure_future(
                leaver.post(f"{upstream.base_url}/chat/completions", json=body)
            )
            try:
                await poll_until(
                    lambda: upstream.load(probe),
                    lambda load: load == (1, 0) or request.done(),
                    timeout=120,
                    what="the long request running",
                    interval=0.1,
                )
                assert not request.done(), f"the long request ended: {_answer(request)}"
            finally:
                request.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await request
                await leaver.aclose()  # the connection closes: the client left
            await poll_until(
                lambda: upstream.load(probe),
                lambda load: load == (0, 0),
                timeout=15,  # vLLM aborts within a second; a loaded machine gets a margin
                what="the abandoned request aborted (running back to 0)",
                interval=0.1,
            )


def _answer(request: asyncio.Future[httpx.Response]) -> str:
    """What a finished request got, for a failure message."""
    if request.exception() is not None:
        return repr(request.exception())
    resp = request.result()
    return f"{resp.status_code} {resp.text[:300]!r}...{resp.text[-300:]!r}"


class Stream:
    """A streamed chat request in the background; `first` is set at its first event."""

    def __init__(self, upstream: Upstream, body: dict[str, Any]) -> None:
        self.http = httpx.AsyncClient(timeout=600)
        self.first = asyncio.Event()
        self.task = asyncio.ensure_future(self._run(upstream, body))

    async def _run(self, upstream: Upstream, body: dict[str, Any]) -> None:
        url = f"{upstream.base_url}/chat/completions"
        async with self.http.stream("POST", url, json={**body, "stream": True}) as resp:
            assert resp.status_code == 200, await resp.aread()
            async for _ in sse(resp):
                self.first.set()

    async def close(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
            await self.task
        await self.http.aclose()


async def _first_admitted(up: Upstream) -> str:
    """Fill every seat, queue `late` (priority 10) then `urgent` (priority -10), free one seat:
    which of the two starts first."""
    async with httpx.AsyncClient(timeout=60) as probe:
        streams: list[Stream] = []

        async def load(expected: tuple[int, int], what: str, timeout: float = 120) -> None:  # noqa: ASYNC109
            await poll_until(
                lambda: up.load(probe),
                lambda got: got == expected,
                timeout=timeout,
                what=f"{what} (running, waiting) = {expected}",
                interval=0.1,
            )

        with up.slow(service=False):  # a freed seat's next request starts at once
            try:
                filler = chat(LONG_PROMPT, **up.long_body())
                streams += [Stream(up, filler) for _ in range(SEATS)]
                await load((SEATS, 0), "every seat taken")
                # Both long too: the first to start must keep its seat while the test looks.
                late = Stream(up, {**filler, "priority": 10})
                streams.append(late)
                await load((SEATS, 1), "the first request queued")
                urgent = Stream(up, {**filler, "priority": -10})
                streams.append(urgent)
                await load((SEATS, 2), "both requests queued")
                assert not late.first.is_set() and not urgent.first.is_set()
                await streams[0].close()  # one seat frees: exactly one of the two starts
                waits = [asyncio.ensure_future(s.first.wait()) for s in (late, urgent)]
                done, pending = await asyncio.wait(
                    waits, timeout=120, return_when="FIRST_COMPLETED"
                )
                for w in pending:
                    w.cancel()
                assert done, "neither queued request started after a seat freed"
                # Exactly one seat freed: the other fillers still run, the other request waits.
                # (Were the fillers done, both would have started: the test says so.)
                await load(
                    (SEATS, 1), "one seat freed and taken (else: the fillers ended early)", 10
                )
                assert late.first.is_set() != urgent.first.is_set(), "both started"
                return "late" if late.first.is_set() else "urgent"
            finally:
                for s in streams:
                    await s.close()


async def test_priority_is_accepted_and_ignored_under_fcfs(upstream: Upstream) -> None:
    """backfill adds `priority` to batch lines where the route has a hint; under the default
    `fcfs` policy the server must accept it and keep arrival order."""
    assert await _first_admitted(upstream) == "late"


async def test_continue_final_message_continues_the_assistant_message(upstream: Upstream) -> None:
    """How a line resumed from a partial answer asks for the rest of it."""
    messages = [
        {"role": "user", "content": "Say something"},
        {"role": "assistant", "content": "The quick brown"},
    ]
    body = {"model": MODEL, "messages": messages, "max_tokens": 4}
    async with httpx.AsyncClient(timeout=120) as http:
        url = f"{upstream.base_url}/chat/completions"
        r = await http.post(
            url, json={**body, "continue_final_message": True, "add_generation_prompt": False}
        )
        assert r.status_code == 200, r.text
        answer = r.json()
        assert answer["choices"][0]["message"]["role"] == "assistant"
        assert 1 <= answer["usage"]["completion_tokens"] <= 4
        both = {**body, "continue_final_message": True, "add_generation_prompt": True}
        r = await http.post(url, json=both)
        assert r.status_code == 400, r.text
        assert_error_shape(r.json(), 400)


@pytest.mark.parametrize("path", ["/chat/completions", "/completions"])
async def test_stream_options_include_usage_adds_one_usage_chunk(
    upstream: Upstream, path: str
) -> None:
    body: dict[str, Any] = (
        chat(max_tokens=5) if path == "/chat/completions" else {"model": MODEL, "prompt": "hi"}
    )
    body = {"max_tokens": 5, **body, "stream": True}
    async with httpx.AsyncClient(timeout=120) as http:
        url = f"{upstream.base_url}{path}"
        with_usage = {**body, "stream_options": {"include_usage": True}}
        async with http.stream("POST", url, json=with_usage) as resp:
            assert resp.status_code == 200
            events = [e async for e in sse(resp)]
        async with http.stream("POST", url, json=body) as resp:
            assert resp.status_code == 200
            plain = [e async for e in sse(resp)]
    *before, last = events
    assert last["choices"] == [], last
    usage = last["usage"]
    assert usage["prompt_tokens"] > 0 and 1 <= usage["completion_tokens"] <= 5
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert all(e.get("usage") is None for e in before)
    assert all(e.get("usage") is None for e in plain) and plain[-1]["choices"]


RESPONSE_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]


async def test_responses_stream_has_the_event_sequence_the_sdk_helper_needs(
    upstream: Upstream,
) -> None:
    oa = openai.AsyncOpenAI(base_url=upstream.base_url, api_key="unused", max_retries=0)
    kinds: list[str] = []
    text = ""
    async with oa.responses.stream(model=MODEL, input="hello there", max_output_tokens=8) as s:
        async for event in s:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                text += event.delta
        final = await s.get_final_response()
    deltas = [i for i, k in enumerate(kinds) if k == "response.output_text.delta"]
    assert [k for k in kinds if k != "response.output_text.delta"] == RESPONSE_EVENTS, kinds
    assert deltas == list(range(4, 4 + len(deltas))), kinds  # between part added and text done
    assert final.output_text == text
    assert final.usage is not None and 1 <= final.usage.output_tokens <= 8
    assert final.usage.total_tokens == final.usage.input_tokens + final.usage.output_tokens


async def test_usage_fields_of_each_endpoint(upstream: Upstream) -> None:
    """What backfill counts per line (`backfill.upstream.endpoints` usage fields) is there."""
    async with httpx.AsyncClient(timeout=120) as http:
        for path, body in [
            ("/chat/completions", chat(max_tokens=6)),
            ("/completions", {"model": MODEL, "prompt": "hello there", "max_tokens": 6}),
        ]:
            r = await http.post(f"{upstream.base_url}{path}", json=body)
            assert r.status_code == 200, r.text
            usage = r.json()["usage"]
            assert usage["prompt_tokens"] > 0 and 1 <= usage["completion_tokens"] <= 6, usage
            assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        r = await http.post(
            f"{upstream.base_url}/responses",
            json={"model": MODEL, "input": "hello there", "max_output_tokens": 6},
        )
        assert r.status_code == 200, r.text
        usage = r.json()["usage"]
        assert usage["input_tokens"] > 0 and 1 <= usage["output_tokens"] <= 6, usage
        assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
        assert isinstance(usage["input_tokens_details"]["cached_tokens"], int)
        assert isinstance(usage["output_tokens_details"]["reasoning_tokens"], int)


def assert_error_shape(body: Any, status: int) -> dict[str, Any]:
    """OpenAI's error envelope, as vLLM sends it (`code` is the HTTP status)."""
    error = body["error"]
    assert isinstance(error["message"], str) and error["message"], body
    assert isinstance(error["type"], str) and error["type"], body
    assert "param" in error and error["code"] == status, body
    return error  # type: ignore[no-any-return]


BAD_REQUESTS = {
    "unknown-model": (chat(model="no-such-model"), 404),
    "max-tokens-zero": (chat(max_tokens=0), 400),
    "max-tokens-not-a-number": (chat(max_tokens="many"), 400),
    "max-tokens-over-the-context": (chat(max_tokens=MAX_MODEL_LEN + 1), 400),
    "prompt-over-the-context": (chat(" ".join(["hello"] * (MAX_MODEL_LEN + 200))), 400),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
async def test_bad_requests_get_an_error_of_openais_shape(upstream: Upstream, case: str) -> None:
    """backfill records a line's 4xx as the upstream sent it and counts it failed, not retried."""
    body, status = BAD_REQUESTS[case]
    async with httpx.AsyncClient(timeout=120) as http:
        r = await http.post(f"{upstream.base_url}/chat/completions", json=body)
    assert r.status_code == status, r.text
    error = assert_error_shape(r.json(), status)
    if case == "unknown-model":
        assert error["param"] == "model"
