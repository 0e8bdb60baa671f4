"""Batch lines that may be preempted go upstream streamed, and the record is the answer the line
asked for: the same object, field by field, as the server's non-streamed answer (the simulator
on loopback as the server, the `openai` SDK as the reader of both)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import pytest_asyncio
from temporalio.testing import ActivityEnvironment

from activities.lines.run_line import LineActivities
from activities.preemption.board import PreemptBoard
from activities.validation import ValidationActivities
from backfill.batches.streamed_answer import Partial, Reassembled, StreamError, streamable
from backfill.files import FileStore
from backfill.platform.config import Settings
from backfill.platform.messages import LineInput, LineOutcome, ValidateInput
from backfill.routes.gates.preempt import PreemptPolicy
from tests.polling import poll_until
from tools.sim import SimConfig, SimServer

MODULE_LOOP = pytest.mark.asyncio(loop_scope="module")
BATCH = "batch_streamed"
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
POLICY = PreemptPolicy(batch_seats=8, max_preemptions=3)

BODIES: list[tuple[str, dict[str, Any]]] = [
    (CHAT, {"messages": [{"role": "user", "content": "tell me about the sea"}]}),
    (CHAT, {"messages": [{"role": "user", "content": "a b c d e f g"}], "max_tokens": 3}),
    (
        CHAT,
        {
            "messages": [
                {"role": "user", "content": "go on"},
                {"role": "assistant", "content": "Once upon"},
            ],
            "continue_final_message": True,
            "add_generation_prompt": False,
        },
    ),
    (CHAT, {"messages": [{"role": "user", "content": "ünïcødé\u2028line — ✓"}], "n": 1}),
    (COMPLETIONS, {"prompt": "the quick brown fox"}),
    (COMPLETIONS, {"prompt": "one two three four five", "max_tokens": 2}),
]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def sim() -> AsyncIterator[SimServer]:
    async with SimServer(SimConfig(model_names=["demo"], latency_ms=0)) as server:
        yield server


def _activities(tmp_path: Path, sim: SimServer, endpoint: str, body: dict[str, Any]):  # type: ignore[no-untyped-def]
    settings = Settings(
        data_dir=tmp_path,
        models=[{"id": "demo", "routes": [{"id": "r1", "base_url": sim.base_url}]}],
    )
    store = FileStore(tmp_path)
    up = store.begin_upload(1 << 20)
    row = {"custom_id": "c0", "method": "POST", "url": endpoint, "body": {"model": "demo", **body}}
    up.write(json.dumps(row).encode() + b"\n")
    file_id = up.finish(workspace="w", filename="in.jsonl", purpose="batch").id
    board = PreemptBoard()
    board.set_policy("r1", POLICY)
    return settings, store, file_id, board


async def _run_streamed(
    tmp_path: Path, sim: SimServer, endpoint: str, body: dict[str, Any], resume: bool = True
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The line's record, and the bodies the simulator was sent for it."""
    settings, store, file_id, board = _activities(tmp_path, sim, endpoint, body)
    board.set_policy("r1", POLICY.model_copy(update={"resume": resume}))
    out = await ActivityEnvironment().run(
        ValidationActivities(settings, store).validate_input,
        ValidateInput(batch_id=BATCH, input_file_id=file_id, endpoint=endpoint),
    )
    assert out.total == 1 and not out.errors
    sent: list[dict[str, Any]] = []

    async def seen(request: httpx.Request) -> None:
        sent.append(json.loads(request.content))

    async with httpx.AsyncClient(event_hooks={"request": [seen]}) as http:
        acts = LineActivities(settings, store, http, preempt=board)
        line = LineInput(
            batch_id=BATCH,
            input_file_id=file_id,
            endpoint=endpoint,  # type: ignore[arg-type]
            route_id="r1",
            route_index=0,
            position=0,
            final_attempt=True,
        )
        outcome = await ActivityEnvironment().run(acts.run_line, line)
    assert outcome.ok, outcome
    data = store.get_result(BATCH, 0)
    assert data is not None
    return json.loads(data), sent


def _sdk_fields(obj: Any) -> dict[str, Any]:
    """What the SDK parsed, without the per-request `id` and `created`."""
    fields = obj.model_dump(exclude_unset=False)
    fields.pop("id")
    fields.pop("created")
    return fields


@MODULE_LOOP
@pytest.mark.parametrize(("endpoint", "body"), BODIES)
async def test_a_streamed_line_is_recorded_as_the_non_streamed_answer(
    tmp_path: Path, sim: SimServer, endpoint: str, body: dict[str, Any]
) -> None:
    record, sent = await _run_streamed(tmp_path, sim, endpoint, body)
    options = {"include_usage": True, "continuous_usage_stats": True}
    assert [(b["stream"], b["stream_options"]) for b in sent] == [(True, options)]
    answer = record["response"]["body"]

    client = openai.AsyncOpenAI(base_url=sim.base_url, api_key="x", max_retries=0)
    extra = {
        k: v for k, v in body.items() if k in ("continue_final_message", "add_generation_prompt")
    }
    rest = {k: v for k, v in body.items() if k not in extra}
    if endpoint == CHAT:
        direct: Any = await client.chat.completions.create(model="demo", extra_body=extra, **rest)
        parsed: Any = openai.types.chat.ChatCompletion.model_validate(answer)
        assert answer["id"].startswith("chatcmpl-")
    else:
        direct = await client.completions.create(model="demo", **rest)
        parsed = openai.types.Completion.model_validate(answer)
        assert answer["id"].startswith("cmpl-")
    await client.close()
    assert isinstance(answer["created"], int)
    assert _sdk_fields(parsed) == _sdk_fields(direct)
    # The JSON itself, not only the SDK's reading of it: the same keys and values.
    raw = direct.model_dump(exclude_unset=True)
    for obj in (raw, answer):
        obj.pop("id"), obj.pop("created")
    assert answer == raw


@MODULE_LOOP
async def test_a_route_whose_lines_restart_sends_them_as_they_came(
    tmp_path: Path, sim: SimServer
) -> None:
    body = {"messages": [{"role": "user", "content": "hi there"}]}
    record, sent = await _run_streamed(tmp_path, sim, CHAT, body, resume=False)
    assert "stream" not in sent[0] and "stream_options" not in sent[0]
    assert record["response"]["body"]["object"] == "chat.completion"


@MODULE_LOOP
async def test_a_line_the_stream_cannot_rebuild_goes_as_it_came(
    tmp_path: Path, sim: SimServer
) -> None:
    body = {"messages": [{"role": "user", "content": "hi there"}], "n": 2}
    record, sent = await _run_streamed(tmp_path, sim, CHAT, body)
    assert "stream" not in sent[0] and "stream_options" not in sent[0]
    assert len(record["response"]["body"]["choices"]) == 2


@pytest.mark.parametrize(
    ("endpoint", "body"),
    [
        (CHAT, {"n": 2}),
        (CHAT, {"logprobs": True}),
        (CHAT, {"tools": [{"type": "function", "function": {"name": "f"}}]}),
        (CHAT, {"response_format": {"type": "json_object"}}),
        (CHAT, {"guided_regex": "a+"}),
        (COMPLETIONS, {"prompt": "x", "echo": True}),
        (COMPLETIONS, {"prompt": "x", "best_of": 2}),
        (COMPLETIONS, {"prompt": "x", "logprobs": 1}),
        (COMPLETIONS, {"prompt": ["x", "y"]}),
        (COMPLETIONS, {"prompt": [1, 2, 3]}),
        ("/v1/embeddings", {"input": "x"}),
        ("/v1/responses", {"input": "x"}),
    ],
)
def test_lines_whose_answer_is_more_than_text_are_not_streamed(
    endpoint: str, body: dict[str, Any]
) -> None:
    assert not streamable(endpoint, body)


@pytest.mark.parametrize(
    ("endpoint", "body"),
    [
        (CHAT, {"logprobs": False, "n": 1, "tools": None}),
        (COMPLETIONS, {"prompt": "x", "echo": False, "best_of": 1}),
    ],
)
def test_fields_left_at_their_defaults_keep_a_line_streamable(
    endpoint: str, body: dict[str, Any]
) -> None:
    assert streamable(endpoint, body)


def _events(*events: object, done: bool = True) -> bytes:
    out = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    return out + (b"data: [DONE]\n\n" if done else b"")


def test_events_split_anywhere_make_the_same_answer() -> None:
    head = {"id": "chatcmpl-1", "created": 5, "model": "m", "system_fingerprint": "fp"}
    data = _events(
        {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
        {**head, "choices": [{"index": 0, "delta": {"content": "Hé"}, "stop_reason": None}]},
        {**head, "choices": [{"index": 0, "delta": {"reasoning_content": "hm"}}]},
        {**head, "choices": [{"index": 0, "delta": {"content": " llo"}}]},
        {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
        {**head, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}},
    )
    whole = Reassembled(chat=True)
    whole.feed(data)
    whole.end()
    for cut in range(1, len(data), 7):
        parts = Reassembled(chat=True)
        parts.feed(data[:cut])
        parts.feed(data[cut:])
        parts.end()
        assert parts.answer() == whole.answer()
    assert whole.done and whole.pieces == 2 and whole.text() == "Hé llo"
    assert whole.answer() == {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 5,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hé llo", "reasoning_content": "hm"},
                "logprobs": None,
                "finish_reason": "length",
                "stop_reason": None,
            }
        ],
        "system_fingerprint": "fp",
        "usage": {"prompt_tokens": 3, "completion_tokens": 2},
    }


@pytest.mark.parametrize(
    "event",
    [
        {"error": {"message": "engine died", "code": 500}},
        {"id": "x", "choices": [{"index": 1, "delta": {"content": "a"}}]},
        {"id": "x", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0}]}}]},
        {"id": "x", "choices": [{"index": 0, "text": "a", "logprobs": {"tokens": ["a"]}}]},
    ],
)
def test_a_stream_that_is_not_one_plain_answer_is_refused(event: dict[str, Any]) -> None:
    stream = Reassembled(chat="delta" in json.dumps(event))
    with pytest.raises(StreamError):
        stream.feed(_events(event))


@MODULE_LOOP
async def test_an_error_event_mid_stream_sends_the_line_again(tmp_path: Path) -> None:
    """Not a record of half an answer: the line goes back to the queue (a transient failure)."""
    settings = Settings(
        data_dir=tmp_path,
        models=[{"id": "demo", "routes": [{"id": "r1", "base_url": "http://upstream/v1"}]}],
    )
    store = FileStore(tmp_path)
    up = store.begin_upload(1 << 20)
    row = {
        "custom_id": "c0",
        "method": "POST",
        "url": CHAT,
        "body": {"model": "demo", "messages": [{"role": "user", "content": "x"}]},
    }
    up.write(json.dumps(row).encode() + b"\n")
    file_id = up.finish(workspace="w", filename="in.jsonl", purpose="batch").id
    board = PreemptBoard()
    board.set_policy("r1", POLICY)
    cut = _events(
        {"id": "c", "choices": [{"index": 0, "delta": {"content": "half"}}]},
        {"error": {"message": "engine died"}},
        done=False,
    )

    def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=cut, headers={"content-type": "text/event-stream"})

    async def go() -> Any:
        await ActivityEnvironment().run(
            ValidationActivities(settings, store).validate_input,
            ValidateInput(batch_id=BATCH, input_file_id=file_id, endpoint=CHAT),
        )
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
            acts = LineActivities(settings, store, http, preempt=board)
            line = LineInput(
                batch_id=BATCH,
                input_file_id=file_id,
                endpoint=CHAT,
                route_id="r1",
                route_index=0,
                position=0,
                final_attempt=False,
            )
            return await ActivityEnvironment().run(acts.run_line, line)

    outcome = await go()
    assert outcome.retry and store.get_result(BATCH, 0) is None


class _Counting(httpx.AsyncBaseTransport):
    """Real HTTP, counting the SSE events received (what the line has been sent so far)."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.events = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        resp = await self.inner.handle_async_request(request)
        outer, stream = self, resp.stream
        assert isinstance(stream, httpx.AsyncByteStream)

        class Body(httpx.AsyncByteStream):
            async def __aiter__(self) -> AsyncIterator[bytes]:
                async for chunk in stream:
                    outer.events += chunk.count(b"data: {")
                    yield chunk

            async def aclose(self) -> None:
                await stream.aclose()

        return httpx.Response(resp.status_code, headers=resp.headers, stream=Body())

    async def aclose(self) -> None:
        await self.inner.aclose()


PROMPT = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen"
RESUMED: list[tuple[str, dict[str, Any]]] = [
    (CHAT, {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 14}),
    (COMPLETIONS, {"prompt": PROMPT, "max_tokens": 14}),
]


@MODULE_LOOP
@pytest.mark.parametrize(("endpoint", "body"), RESUMED)
async def test_a_line_preempted_three_times_ends_as_the_uninterrupted_answer(
    tmp_path: Path, endpoint: str, body: dict[str, Any]
) -> None:
    """Each run keeps what it generated (nothing wasted) and the next continues it: one record,
    the first run's id, the text and usage of the answer sent without interruption."""
    config = SimConfig(model_names=["demo"], latency_ms=0, stream_token_delay_ms=50)
    async with SimServer(config) as slow:
        settings, store, file_id, board = _activities(tmp_path, slow, endpoint, body)
        board.set_policy("r1", PreemptPolicy(batch_seats=1, max_preemptions=10))
        await ActivityEnvironment().run(
            ValidationActivities(settings, store).validate_input,
            ValidateInput(batch_id=BATCH, input_file_id=file_id, endpoint=endpoint),
        )
        sent: list[dict[str, Any]] = []

        async def seen(request: httpx.Request) -> None:
            sent.append(json.loads(request.content))

        transport = _Counting()
        partials: list[Partial] = []
        outcomes: list[LineOutcome] = []
        async with httpx.AsyncClient(transport=transport, event_hooks={"request": [seen]}) as http:
            acts = LineActivities(settings, store, http, preempt=board)

            def line(preemptions: int) -> LineInput:
                return LineInput(
                    batch_id=BATCH,
                    input_file_id=file_id,
                    endpoint=endpoint,  # type: ignore[arg-type]
                    route_id="r1",
                    route_index=0,
                    position=0,
                    preemptions=preemptions,
                )

            for run in range(3):
                transport.events = 0
                board.report("r1", "api", live=0)
                task = asyncio.ensure_future(ActivityEnvironment().run(acts.run_line, line(run)))
                await poll_until(
                    lambda: transport.events,
                    lambda n: n >= 3,
                    timeout=20,
                    what="a few tokens streamed",
                    interval=0.01,
                )
                assert board.report("r1", "api", live=1) == 1  # live traffic needs the seat
                outcome = await task
                assert outcome.preempted and outcome.wasted_tokens == 0, outcome
                outcomes.append(outcome)
                kept = store.get_partial(BATCH, 0)
                assert kept is not None
                partials.append(Partial.model_validate_json(kept))
            board.report("r1", "api", live=0)
            final = await ActivityEnvironment().run(acts.run_line, line(3))
        assert final.ok, final
        outcomes.append(final)
        client = openai.AsyncOpenAI(base_url=slow.base_url, api_key="x", max_retries=0)
        if endpoint == CHAT:
            direct: Any = await client.chat.completions.create(model="demo", **body)
        else:
            direct = await client.completions.create(model="demo", **body)
        await client.close()

    data = store.get_result(BATCH, 0)
    assert data is not None
    answer = json.loads(data)["response"]["body"]
    if endpoint == CHAT:
        parsed: Any = openai.types.chat.ChatCompletion.model_validate(answer)
        text, expected = parsed.choices[0].message.content, direct.choices[0].message.content
    else:
        parsed = openai.types.Completion.model_validate(answer)
        text, expected = parsed.choices[0].text, direct.choices[0].text
    assert text == expected
    texts = [p.text for p in partials]
    assert all(len(a) < len(b) for a, b in zip(texts, texts[1:], strict=False)), texts
    assert all(text.startswith(t) for t in texts)
    assert parsed.id == partials[0].head["id"] and parsed.created == partials[0].head["created"]
    assert parsed.choices[0].finish_reason == direct.choices[0].finish_reason == "length"
    assert parsed.usage.model_dump() == direct.usage.model_dump()
    assert parsed.usage.completion_tokens == 14
    # Each continuation: the partial answer continued, its token limit lowered.
    assert len(sent) == 4
    for request, partial in zip(sent[1:], partials, strict=True):
        assert request["max_tokens"] == 14 - partial.completion_tokens
        if endpoint == CHAT:
            assert request["messages"][-1] == {"role": "assistant", "content": partial.text}
            assert request["continue_final_message"] is True
            assert request["add_generation_prompt"] is False
        else:
            assert request["prompt"] == PROMPT + partial.text
    # What each continuation sent again as prompt, for the route status (the first run none).
    resent = [o.reprefill_tokens for o in outcomes]
    assert resent == [0] + [(p.prompt_tokens or 0) + p.completion_tokens for p in partials]
    assert all(n > p.completion_tokens for n, p in zip(resent[1:], partials, strict=True))
