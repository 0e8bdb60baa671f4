"""vLLM-like OpenAI-compatible model server simulator: the demo, test and benchmark upstream.

``create_app(config)`` returns a lean raw-ASGI app (no framework in the hot path) that serves
every endpoint of the registry (``backfill.upstream.endpoints``: chat, completions, embeddings,
responses) with deterministic bodies, models a vLLM engine's capacity (``max_num_seqs`` running, the
rest waiting FCFS or by priority), exports vLLM's scheduler gauges on ``/metrics`` and offers test
hooks under ``/sim/*`` (fault injection, traffic statistics). ``SimServer`` runs it on loopback
inside the current event loop; ``main()`` is the ``backfill sim`` command line (``tools.sim.run``).

Two capacity models: by default each request holds a slot for a fixed latency
(``tools.sim.fixed_serve``); with ``SimConfig.gpu`` (``--gpu``) a continuous-batching engine
(``tools.sim.gpu``, served by ``tools.sim.gpu_serve``) decides when each token is produced, and
``/sim/latencies`` reports TTFT and end-to-end latency per class (live requests, batch lines
carrying ``X-Backfill-Batch``). Requests are parsed by ``tools.sim.requests``; the live state
besides the engine is ``tools.sim.stats``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from pydantic import BaseModel, Field, TypeAdapter, ValidationError
from starlette.types import Receive, Scope, Send

from backfill.upstream.endpoints import REGISTRY, EndpointSpec
from tools.sim.asgi import (
    Header,
    error_body,
    read_body,
    send_body,
    send_json,
    until_disconnect,
    wait_disconnect,
)
from tools.sim.faults import FaultAction, FaultInjector, SimFault
from tools.sim.fixed_serve import FixedServing
from tools.sim.gpu import (
    GpuConfig,
    GpuEngine,
    TrafficClass,
)
from tools.sim.gpu_reply import split_words
from tools.sim.gpu_serve import GpuServing
from tools.sim.requests import (
    EMBEDDINGS,
    RESPONSE,
    BadRequest,
    SimRequest,
    parse_request,
)
from tools.sim.stats import ABORTED, DROPPED, Scheduler, SeenRequest, SimStats

__all__ = [
    "BATCH_HEADER",
    "Scheduler",
    "SeenRequest",
    "SimApp",
    "SimConfig",
    "SimStats",
    "create_app",
]

BATCH_HEADER = "X-Backfill-Batch"
_BATCH_KEY = BATCH_HEADER.lower().encode()
_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{{labels}}} {running}
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{{labels}}} {waiting}
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{{labels}}} {kv}
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{{{labels},finished_reason="stop"}} {stop}
vllm:request_success_total{{{labels},finished_reason="length"}} {length}
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{{{labels}}} {prompt}
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{{{labels}}} {generation}
"""
_FAULTS_BODY: TypeAdapter[SimFault | list[SimFault]] = TypeAdapter(SimFault | list[SimFault])


class SimConfig(BaseModel):
    model_names: list[str] = Field(default_factory=lambda: ["demo"])  # [] = accept any model
    max_num_seqs: int = Field(default=64, ge=1)
    latency_ms: float = Field(default=20.0, ge=0)
    latency_per_running_ms: float = Field(default=0.0, ge=0)  # x other running requests
    kv_usage_per_request: float | None = Field(default=None, gt=0, le=1)  # None: 1/max_num_seqs
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    seed: int = 0
    embedding_dim: int = Field(default=16, ge=1, le=8192)
    stream_token_delay_ms: float = Field(default=0.0, ge=0)  # pause before each streamed event
    reply_bytes: int = Field(default=0, ge=0, le=64 * 1024 * 1024)
    """When > 0, each non-streamed completion's text is padded to this many bytes (benches of
    large responses, e.g. bench/worker_rss.py); 0: the usual short reply."""
    faults: list[SimFault] = Field(default_factory=list)
    api_key: str | None = None
    """When set, inference requests without `Authorization: Bearer <api_key>` get a 401 (as a
    server started with `vllm serve --api-key` answers)."""
    timeout_keep_alive_s: float = Field(default=5.0, gt=0)
    """Seconds an idle keep-alive connection stays open before the server closes it (uvicorn's
    `timeout_keep_alive`; 5 s by default, as in vLLM). Lower it to provoke keep-alive races."""
    max_model_len: int | None = Field(default=None, ge=2)
    """A model's context in tokens (words here), as `vllm serve --max-model-len`: a prompt of at
    least this many, or a `max_tokens` above it, is a 400 with vLLM's message. None: no limit."""
    gpu: GpuConfig | None = None
    """GPU mode (continuous batching, `tools.sim.gpu`) instead of fixed per-request latency."""

    @property
    def metrics_model_name(self) -> str:
        return self.model_names[0] if self.model_names else "demo"


class SimApp:
    """The raw ASGI application. ``scheduler``, ``stats`` and ``faults`` are live state."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.scheduler = Scheduler(config.max_num_seqs, config.scheduling_policy == "priority")
        self.engine = (
            None
            if config.gpu is None
            else GpuEngine(config.gpu, config.max_num_seqs, config.scheduling_policy == "priority")
        )
        self.stats = SimStats()
        self.gpu = None if self.engine is None else GpuServing(self.engine, self.stats, config)
        self.fixed = FixedServing(self.stats, config)
        self.seen: deque[SeenRequest] = deque(maxlen=1024)  # the latest requests, oldest first
        self.faults = FaultInjector(config.faults, seed=config.seed)
        self._models = frozenset(config.model_names)
        self._created = int(time.time())
        self._kv_per_request = config.kv_usage_per_request or 1.0 / config.max_num_seqs
        self._routes: dict[tuple[str, str], Callable[[Receive, Send], Awaitable[int]]] = {
            ("GET", "/health"): lambda r, s: send_json(s, 200, {}),
            ("GET", "/v1/models"): self._models_list,
            ("GET", "/metrics"): self._metrics,
            ("GET", "/sim/stats"): lambda r, s: send_json(s, 200, self.stats_dict()),
            ("POST", "/sim/stats/reset"): self._reset_stats,
            ("GET", "/sim/latencies"): self._latencies,
            ("POST", "/sim/latencies/reset"): self._reset_latencies,
            ("GET", "/sim/faults"): lambda r, s: send_json(s, 200, self._faults_dict()),
            ("POST", "/sim/faults"): self._add_faults,
            ("DELETE", "/sim/faults"): self._clear_faults,
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path, method = scope["path"], scope["method"]
            if (spec := REGISTRY.get(path)) is not None and method == "POST":
                await self._inference(spec, scope, receive, send)
            elif (route := self._routes.get((method, path))) is not None:
                await route(receive, send)
            else:
                known = path in REGISTRY or any(p == path for _, p in self._routes)
                await send_json(send, 405 if known else 404, {"detail": "Not Found"})
        elif scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return

    def processing_delay_s(self, running: int) -> float:
        """Service time of a request starting with ``running`` requests running (incl. itself)."""
        c = self.config
        return (c.latency_ms + c.latency_per_running_ms * max(running - 1, 0)) / 1000.0

    @property
    def load(self) -> Scheduler | GpuEngine:
        """Where running/waiting/peaks come from: the GPU engine in GPU mode."""
        return self.scheduler if self.engine is None else self.engine

    @property
    def kv_cache_usage(self) -> float:
        if self.engine is not None:
            return self.engine.kv_cache_usage
        return min(1.0, self.scheduler.running * self._kv_per_request)

    async def _inference(
        self, spec: EndpointSpec, scope: Scope, receive: Receive, send: Send
    ) -> None:
        headers: dict[bytes, bytes] = dict(scope["headers"])
        batch = headers.get(_BATCH_KEY)
        rid = headers.get(b"x-request-id")
        request_id = rid.decode("latin-1") if rid else uuid.uuid4().hex
        self.stats.begin(batch)
        status = ABORTED
        try:
            status = await self._serve(spec, headers, request_id, receive, send)
        finally:
            self.stats.end(batch, status)

    async def _serve(
        self,
        spec: EndpointSpec,
        headers: dict[bytes, bytes],
        rid: str,
        receive: Receive,
        send: Send,
    ) -> int:
        path = spec.path
        hdrs = [(b"x-request-id", rid.encode("latin-1"))]
        try:
            req = parse_request(spec, await read_body(receive))
        except BadRequest as e:
            return await send_json(send, 400, error_body(400, str(e)), hdrs)
        self._see(path, headers, req)
        req.batch = _BATCH_KEY in headers
        key = self.config.api_key
        if key is not None and headers.get(b"authorization") != b"Bearer " + key.encode():
            return await send_json(send, 401, error_body(401, "Invalid API key"), hdrs)
        if self._models and req.model not in self._models:
            msg = f"The model `{req.model}` does not exist."
            return await send_json(send, 404, error_body(404, msg, "model"), hdrs)
        if (too_long := self._too_long(req)) is not None:
            return await send_json(send, 400, too_long, hdrs)
        self.stats.priorities[req.priority] += 1
        action = self.faults.pick(path, headers)
        if action is not None and (action.drop or action.status is not None):
            return await self._fail(action, hdrs, receive, send)
        fault_delay = action.delay_s if action else 0.0
        if self.engine is not None and req.kind != RESPONSE:  # GPU mode: chat-shaped only
            traffic: TrafficClass = "live" if _BATCH_KEY not in headers else "batch"
            assert self.gpu is not None
            return await self.gpu.respond(req, traffic, fault_delay, hdrs, receive, send)
        sched = self.scheduler
        if fault_delay > 0 or self.processing_delay_s(sched.running + 1) > 0:
            admit = self._admit(req.priority, fault_delay)
            if not await until_disconnect(admit, receive, on_orphan=sched.release):
                return ABORTED
        elif not sched.try_acquire():
            if not await until_disconnect(sched.acquire(req.priority), receive, sched.release):
                return ABORTED
        try:
            return await self.fixed.respond(req, hdrs, receive, send)
        finally:
            sched.release()

    def _too_long(self, req: SimRequest) -> dict[str, Any] | None:
        """vLLM's 400 for a request that does not fit `max_model_len`, else None."""
        limit = self.config.max_model_len
        if limit is None or req.kind == EMBEDDINGS:
            return None
        if req.max_tokens is not None and req.max_tokens > limit:
            msg = (
                f"max_tokens={req.max_tokens} cannot be greater than max_model_len={limit}. "
                "Please request fewer output tokens."
            )
            return error_body(400, msg, "max_tokens")
        prompt = sum(len(split_words(t)) for t in req.texts)
        if prompt >= limit:
            msg = (
                f"This model's maximum context length is {limit} tokens. However, your prompt "
                f"contains at least {prompt} input tokens, which exceeds this limit even without "
                "any output tokens. Please reduce the length of the input prompt."
            )
            return error_body(400, msg, "input_tokens")
        return None

    def _see(self, path: str, headers: dict[bytes, bytes], req: SimRequest) -> None:
        def text(name: bytes) -> str | None:
            value = headers.get(name)
            return None if value is None else value.decode("latin-1")

        self.seen.append(
            SeenRequest(
                path=path,
                request_id=text(b"x-request-id"),
                batch=text(_BATCH_KEY),
                authorization=text(b"authorization"),
                has_priority="priority" in req.raw,
                at=time.monotonic(),
                priority=req.raw.get("priority"),
            )
        )

    async def _fail(
        self, action: FaultAction, hdrs: list[Header], receive: Receive, send: Send
    ) -> int:
        """An injected failure: optional delay (no running slot used), then drop or error."""
        if action.delay_s > 0:
            if not await until_disconnect(asyncio.sleep(action.delay_s), receive):
                return ABORTED
        if action.drop:
            await self._drop(receive, send)
            return DROPPED
        status = action.status or 500
        if action.retry_after is not None:
            hdrs.append((b"retry-after", b"%g" % action.retry_after))
        body = error_body(status, action.message or "Simulated fault")
        return await send_json(send, status, body, hdrs)

    async def _admit(self, priority: int, fault_delay: float) -> None:
        """Extra (fault) delay, then a running slot, then the service time; returns holding it."""
        if fault_delay > 0:
            await asyncio.sleep(fault_delay)
        await self.scheduler.acquire(priority)
        try:
            delay = self.processing_delay_s(self.scheduler.running)
            if delay > 0:
                await asyncio.sleep(delay)
        except BaseException:
            self.scheduler.release()
            raise

    async def _drop(self, receive: Receive, send: Send) -> None:
        """Close the connection without a response (uvicorn's cycle exposes its transport)."""
        transport = getattr(getattr(send, "__self__", None), "transport", None)
        if not isinstance(transport, asyncio.BaseTransport):
            raise ConnectionAbortedError("simulated connection drop")
        transport.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wait_disconnect(receive), 2.0)

    def stats_dict(self) -> dict[str, Any]:
        st, sched = self.stats, self.load
        return {
            "requests_total": st.all.requests_total,
            "responses_by_status": {str(k): v for k, v in st.by_status.items() if k > 0},
            "dropped": st.by_status[DROPPED],
            "aborted": st.by_status[ABORTED],
            "running": sched.running,
            "waiting": sched.waiting,
            "peak_running": sched.peak_running,
            "peak_waiting": sched.peak_waiting,
            "concurrent": st.all.concurrent,
            "peak_concurrent": st.all.peak_concurrent,
            "kv_cache_usage": self.kv_cache_usage,
            "batch": {**st.batch.as_dict(), "by_batch": dict(st.by_batch)},
            "live": st.live.as_dict(),
            "priorities_seen": {str(k): v for k, v in st.priorities.items()},
            "faults_active": len(self.faults),
            **({} if self.gpu is None else {"gpu": self.gpu.as_dict()}),
        }

    def metrics_text(self) -> str:
        name = self.config.metrics_model_name
        name = name.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        st, sched = self.stats, self.load
        return _METRICS.format(
            labels=f'engine="0",model_name="{name}"',
            running=float(sched.running),
            waiting=float(sched.waiting),
            kv=float(self.kv_cache_usage),
            stop=float(st.success_by_reason["stop"]),
            length=float(st.success_by_reason["length"]),
            prompt=float(st.prompt_tokens),
            generation=float(st.generation_tokens),
        )

    async def _metrics(self, receive: Receive, send: Send) -> int:
        ctype = b"text/plain; version=0.0.4; charset=utf-8"
        return await send_body(send, 200, self.metrics_text().encode(), ctype)

    async def _models_list(self, receive: Receive, send: Send) -> int:
        data = [
            {
                "id": m,
                "object": "model",
                "created": self._created,
                "owned_by": "vllm",
                "root": m,
                "parent": None,
                "max_model_len": 8192,
            }
            for m in self.config.model_names or [self.config.metrics_model_name]
        ]
        return await send_json(send, 200, {"object": "list", "data": data})

    def _faults_dict(self) -> dict[str, Any]:
        return {"faults": self.faults.describe()}

    async def _add_faults(self, receive: Receive, send: Send) -> int:
        try:
            parsed = _FAULTS_BODY.validate_json(await read_body(receive))
        except ValidationError as e:
            msg = f"Invalid fault: {e.errors(include_url=False)}"
            return await send_json(send, 400, error_body(400, msg))
        self.faults.add(parsed if isinstance(parsed, list) else [parsed])
        return await send_json(send, 200, self._faults_dict())

    async def _clear_faults(self, receive: Receive, send: Send) -> int:
        self.faults.clear()
        return await send_json(send, 200, self._faults_dict())

    async def _reset_stats(self, receive: Receive, send: Send) -> int:
        self.stats.reset(self.load)
        if self.engine is not None:
            self.engine.log.reset()
        return await send_json(send, 200, self.stats_dict())

    async def _latencies(self, receive: Receive, send: Send) -> int:
        if self.engine is None:
            return await send_json(send, 404, error_body(404, "Not in GPU mode (--gpu)"))
        return await send_json(send, 200, self.engine.log.summary())

    async def _reset_latencies(self, receive: Receive, send: Send) -> int:
        if self.engine is None:
            return await send_json(send, 404, error_body(404, "Not in GPU mode (--gpu)"))
        self.engine.log.reset()
        return await send_json(send, 200, self.engine.log.summary())


def create_app(config: SimConfig | None = None) -> SimApp:
    """A fresh simulator (own scheduler, stats, faults); runs under uvicorn or ASGITransport."""
    return SimApp(config or SimConfig())
