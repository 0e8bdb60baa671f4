"""The fixed-latency mode's answers (the simulator's default): once a request holds a seat for its
latency (`tools.sim.stats.Scheduler`), the whole reply is written at once, or streamed with
`stream_token_delay_ms` between events; chat, completions (a continuation included,
`tools.sim.requests.reply_pieces`), embeddings and `/v1/responses`."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any, Protocol

from starlette.types import Receive, Send

from tools.sim import responses
from tools.sim.asgi import Header, send_json, until_disconnect
from tools.sim.gpu_reply import dumps, split_words
from tools.sim.requests import (
    CHAT,
    EMBEDDINGS,
    RESPONSE,
    EmbeddingConfig,
    SimRequest,
    embeddings_body,
    reply_pieces,
    reply_words,
)
from tools.sim.stats import ABORTED, SimStats


class FixedConfig(EmbeddingConfig, Protocol):
    """What the fixed mode reads of the simulator's config (`server.SimConfig` is one)."""

    @property
    def reply_bytes(self) -> int:
        """Bytes a non-streamed completion's text is padded to (0: the usual short reply)."""
        ...

    @property
    def stream_token_delay_ms(self) -> float:
        """The pause before each streamed event."""
        ...


class FixedServing:
    """The fixed-latency mode's inference answers, over the app's stats."""

    def __init__(self, stats: SimStats, config: FixedConfig) -> None:
        self.stats, self.config = stats, config

    async def respond(
        self, req: SimRequest, hdrs: list[Header], receive: Receive, send: Send
    ) -> int:
        st, n, c = self.stats, req.n, self.config
        prompt_tokens = max(1, sum(len(split_words(t)) for t in req.texts))
        st.prompt_tokens += prompt_tokens
        if req.kind == EMBEDDINGS:
            st.success_by_reason["stop"] += 1
            st.served(req, {"prompt_tokens": prompt_tokens})
            return await send_json(
                send,
                200,
                embeddings_body(req, prompt_tokens, c.embedding_dim, c.seed),
                hdrs,
            )
        if req.kind == RESPONSE:
            return await self._respond_response(req, prompt_tokens, hdrs, receive, send)
        chat = req.kind == CHAT
        prompts = req.texts[-1:] if chat else req.texts
        replies = [reply_pieces(req, p) for p in prompts]
        completion_tokens = n * sum(len(w) for w, _ in replies)
        st.generation_tokens += completion_tokens
        st.success_by_reason[replies[0][1]] += 1
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        head = {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": req.model,
        }
        if req.stream:
            return await self._stream(req, head, replies, usage, hdrs, receive, send)
        choices = []
        pad = self.config.reply_bytes
        for i, (words, reason) in enumerate(r for r in replies for _ in range(n)):
            text = "".join(words)
            if pad > len(text):
                text += " " + "x" * (pad - len(text) - 1)
            body: dict[str, Any] = (
                {"message": {"role": req.role, "content": text}} if chat else {"text": text}
            )
            choices.append({"index": i, **body, "finish_reason": reason, "logprobs": None})
        st.served(req, usage)
        return await send_json(send, 200, {**head, "choices": choices, "usage": usage}, hdrs)

    async def _stream(
        self,
        req: SimRequest,
        head: dict[str, Any],
        replies: list[tuple[list[str], str]],
        usage: dict[str, int],
        hdrs: list[Header],
        receive: Receive,
        send: Send,
    ) -> int:
        chat = req.kind == CHAT
        head = {**head, "object": "chat.completion.chunk" if chat else "text_completion"}
        start = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"), *hdrs]
        await send({"type": "http.response.start", "status": 200, "headers": start})

        opts = req.raw.get("stream_options")
        continuous = req.include_usage and bool(opts.get("continuous_usage_stats"))  # type: ignore[union-attr]
        sent = 0

        def chunk(index: int, piece: str | None, reason: str | None = None) -> dict[str, Any]:
            if chat:
                delta = {} if piece is None else {"content": piece}
                if piece == "":
                    delta["role"] = req.role
                c: dict[str, Any] = {"index": index, "delta": delta}
            else:
                c = {"index": index, "text": piece or ""}
            event = {**head, "choices": [{**c, "logprobs": None, "finish_reason": reason}]}
            if continuous:  # vLLM's continuous_usage_stats: the counts so far in every event
                prompt = usage["prompt_tokens"]
                event["usage"] = {
                    "prompt_tokens": prompt,
                    "completion_tokens": sent,
                    "total_tokens": prompt + sent,
                }
            return event

        def events() -> Iterator[dict[str, Any]]:
            nonlocal sent
            for i, (words, reason) in enumerate(r for r in replies for _ in range(req.n)):
                if chat:
                    yield chunk(i, "")
                for word in words:
                    sent += 1
                    yield chunk(i, word)
                yield chunk(i, None, reason)
            if req.include_usage:
                yield {**head, "choices": [], "usage": usage}

        delay = self.config.stream_token_delay_ms / 1000.0
        for event in events():
            if delay > 0 and not await until_disconnect(asyncio.sleep(delay), receive):
                return ABORTED  # the client left mid-stream: stop generating, like vLLM
            data = b"data: " + dumps(event) + b"\n\n"
            await send({"type": "http.response.body", "body": data, "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
        self.stats.served(req, usage)
        return 200

    async def _respond_response(
        self, req: SimRequest, prompt_tokens: int, hdrs: list[Header], receive: Receive, send: Send
    ) -> int:
        """`/v1/responses`: a Response object, or its events when `stream` is set."""
        words, reason = reply_words("Simulated", req.texts[-1], req.max_tokens)
        self.stats.generation_tokens += len(words)
        self.stats.success_by_reason[reason] += 1
        usage = responses.usage(prompt_tokens, len(words))
        reply = responses.ResponseReply(req.model, words, reason)
        served = {"prompt_tokens": prompt_tokens, "completion_tokens": len(words)}
        if not req.stream:
            self.stats.served(req, served)
            return await send_json(send, 200, reply.body(usage), hdrs)
        start = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"), *hdrs]
        await send({"type": "http.response.start", "status": 200, "headers": start})
        delay = self.config.stream_token_delay_ms / 1000.0
        events = [reply.created(), *(reply.delta(j) for j in range(len(words)))]
        for data in events:
            if delay > 0 and not await until_disconnect(asyncio.sleep(delay), receive):
                return ABORTED  # the client left mid-stream
            await send({"type": "http.response.body", "body": data, "more_body": True})
        await send({"type": "http.response.body", "body": reply.completed(usage)})
        self.stats.served(req, served)
        return 200
