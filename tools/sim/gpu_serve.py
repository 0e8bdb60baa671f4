"""GPU mode over HTTP: a request becomes one engine sequence (`tools.sim.gpu`), and each token is
sent (streaming) as the step that made it completes. Its reply (`tools.sim.gpu_reply`) answers
the prompt, or continues a reply already begun; the sequence carries the prompt's and the
reply's tokens for the prefix cache, and what it continues for the waste count."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.types import Receive, Send

from tools.sim.asgi import Header, error_body, send_json, until_disconnect, wait_disconnect
from tools.sim.gpu import FINISHED, GpuEngine, GpuSequence, SequenceTooLong, TrafficClass
from tools.sim.gpu_reply import GpuReply, continuation, split_words
from tools.sim.requests import CHAT, EMBEDDINGS, EmbeddingConfig, SimRequest, embeddings_body
from tools.sim.stats import ABORTED, SimStats


def reply_for(req: SimRequest, chat: bool, prompt_tokens: int) -> GpuReply:
    """The reply's tokens: to the last message (chat) or each prompt, or the rest of a
    reply a continuation begins (`gpu_reply.continuation`)."""
    prompts = [p for p in (req.texts[-1:] if chat else req.texts) for _ in range(req.n)]
    reason = "length" if req.max_tokens else "stop"
    continued_final = bool(req.raw.get("continue_final_message"))
    cont = continuation(chat, req.texts, continued_final, req.role) if req.n == 1 else None
    offset = 0
    if cont is not None:
        prompts, offset = [cont[0]], cont[1]
    opts = req.raw.get("stream_options")
    continuous = req.include_usage and isinstance(opts, dict)
    continuous = continuous and bool(opts.get("continuous_usage_stats"))  # type: ignore[union-attr]
    so_far = prompt_tokens if continuous else None
    return GpuReply(chat, req.stream, req.model, prompts, reason, offset, so_far)


class GpuServing:
    """The GPU mode's inference answers, over the app's engine and stats."""

    def __init__(self, engine: GpuEngine, stats: SimStats, config: EmbeddingConfig) -> None:
        self.engine, self.stats, self.config = engine, stats, config

    async def respond(
        self,
        req: SimRequest,
        traffic: TrafficClass,
        fault_delay: float,
        hdrs: list[Header],
        receive: Receive,
        send: Send,
    ) -> int:
        """GPU mode: the request becomes one engine sequence; each token is sent (streaming) as
        the step that made it completes."""
        st, engine = self.stats, self.engine
        chat, emb = req.kind == CHAT, req.kind == EMBEDDINGS
        prompt_tokens = max(1, sum(len(split_words(t)) for t in req.texts))
        max_new = 0 if emb else (req.max_tokens or engine.config.default_output_tokens)
        seq = GpuSequence(prompt_tokens, max_new, req.priority, traffic, "priority" in req.raw)
        reply = None if emb else reply_for(req, chat, prompt_tokens)
        if reply is not None:
            # The prefix cache's names for its tokens: the prompt's words, then the reply's.
            prompt = [w for t in req.texts for w in split_words(t)]
            seq.text = prompt + reply.words(max_new) if req.n == 1 else prompt
            seq.key, seq.continues = reply.prompts[0], reply.offset
        if fault_delay > 0 and not await until_disconnect(asyncio.sleep(fault_delay), receive):
            return ABORTED
        try:
            engine.submit(seq)
        except SequenceTooLong as e:
            return await send_json(send, 400, error_body(400, str(e)), hdrs)
        watch = asyncio.ensure_future(wait_disconnect(receive))

        def on_disconnect(t: asyncio.Future[None]) -> None:
            if not t.cancelled():
                engine.abort(seq)

        watch.add_done_callback(on_disconnect)
        try:
            return await self._reply(req, seq, reply, hdrs, send)
        finally:
            watch.cancel()
            engine.abort(seq)  # no-op once finished
            st.prompt_tokens += prompt_tokens

    async def _reply(
        self,
        req: SimRequest,
        seq: GpuSequence,
        reply: GpuReply | None,
        hdrs: list[Header],
        send: Send,
    ) -> int:
        st, c = self.stats, self.config
        if reply is None:  # embeddings
            while await seq.tokens.get() is not FINISHED:
                pass
            if seq.aborted:
                return ABORTED
            st.success_by_reason["stop"] += 1
            st.served(req, {"prompt_tokens": seq.prompt_tokens})
            return await send_json(
                send,
                200,
                embeddings_body(req, seq.prompt_tokens, c.embedding_dim, c.seed),
                hdrs,
            )
        prompts, reason = reply.prompts, reply.reason
        if req.stream:
            start = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
            await send({"type": "http.response.start", "status": 200, "headers": start + hdrs})
        j = 0
        while await seq.tokens.get() is not FINISHED:
            st.generation_tokens += len(prompts)
            if req.stream:
                body = reply.token_events(j)
                await send({"type": "http.response.body", "body": body, "more_body": True})
            j += 1
        if seq.aborted:
            return ABORTED
        st.success_by_reason[reason] += 1
        completion = j * len(prompts)
        usage = {
            "prompt_tokens": seq.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": seq.prompt_tokens + completion,
        }
        st.served(req, usage)
        if req.stream:
            tail = reply.tail_events(usage if req.include_usage else None)
            await send({"type": "http.response.body", "body": tail})
            return 200
        return await send_json(send, 200, reply.body(j, usage), hdrs)

    def as_dict(self) -> dict[str, Any]:
        """``/sim/stats``'s ``gpu``: steps, KV cache, prefix cache and latencies."""
        engine = self.engine
        return {
            "steps": engine.steps,
            "busy_s": engine.busy_s,
            "kv_cache_tokens_held": engine.held_tokens,
            "prefix_cache": None
            if (cache := engine.prefix_cache) is None
            else {"queries": cache.queries, "hits": cache.hits, "blocks": len(cache)},
            "latencies": engine.log.summary(),
        }
