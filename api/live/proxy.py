"""The live proxy: OpenAI's inference endpoints, forwarded to the model's routes.

Every endpoint the registry (`backfill.upstream.endpoints`) marks `live` (`POST
/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`) goes to the route the model's routing
policy picks (`backfill.routes.routing.choose_route`, the routes batches use), with the route's own
credential (`api_key_env`), never the client's gateway key; the request is built by
`backfill.upstream.request`, as batch lines' are. The body must be strict JSON
(`backfill.platform.strict_json`, else 400) and is forwarded as sent, except that a client's own
`priority` is dropped (only the gateway sets it, on batch lines); no client header but `Accept`
goes upstream (so never `X-Backfill-Batch`). The response is relayed as it arrives, byte for
byte, so SSE streams token by token. Each request is counted in flight on its route
(`api.live.traffic`, at most `max_live_counted` of one workspace) until the model server's answer
has been received whole (held for the client within `limits.live_buffer_bytes`, `api.live.relay`),
the client disconnects, or it fails; a client that reads nothing for `limits.live_stall_seconds`
is cut. Nothing here touches Temporal.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import anyio
import httpx
from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from api.deps import Identity, IdentityDep, SettingsDep, WriterDep, get_http
from api.errors import APIError, InvalidRequest, NotFound, PayloadTooLarge
from api.live.connection_cut import cut
from api.live.limits import take_live_slot
from api.live.relay import CLIENTS_CUT, RelayBudget, RelayBuffer
from api.live.traffic import LiveCount, LiveTraffic
from api.live.usage_counts import UsageReader
from api.request_id import request_id
from api.schemas import COMMON_ERRORS, ErrorResponse
from backfill.platform import strict_json, tracing
from backfill.platform.config import ModelConfig, Settings
from backfill.platform.metrics import LIVE_REQUEST_SECONDS
from backfill.routes.routing import choose_route
from backfill.tenancy.byte_budget import ByteBudget, Claim
from backfill.upstream.body_policy import refusal_message, refused_field
from backfill.upstream.endpoints import CHAT_USAGE, REGISTRY, EndpointSpec, UsageFields
from backfill.upstream.request import build_upstream_request, forwarded_body
from backfill.usage.journal import UsageAccount, UsageJournal

router = APIRouter(prefix="/v1", tags=["live"], responses=COMMON_ERRORS)
log = logging.getLogger(__name__)

LIVE_ROUTING_KEY = "live"
"""Stands in for the batch id when a live request's route is chosen (by its request id)."""
CUT_HEARD_WITHIN_SECONDS = 1.0
"""How long a cut client's exchange waits to hear the reset (it comes at once) before it ends
anyway."""
ERROR_BODY_LIMIT = 64 * 1024
"""An upstream error body larger than this is not passed through (only its start is quoted)."""
_HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"server",
        b"date",
        b"x-request-id",
    }
)
"""Upstream response headers not relayed (the api's server sets its own `server`/`date`;
`x-request-id` is the api's, set by `RequestIdMiddleware`)."""


def get_live(request: Request) -> LiveTraffic:
    return request.app.state.live  # type: ignore[no-any-return]


LiveDep = Annotated[LiveTraffic, Depends(get_live)]
HttpDep = Annotated[httpx.AsyncClient, Depends(get_http)]


class ModelObject(BaseModel):
    """One model clients may name in `model` (OpenAI's Model object)."""

    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "backfill"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelObject]


_LIVE_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The upstream's answer, relayed as it arrives: JSON, or SSE when the "
        "request set `stream`.",
        "content": {
            "application/json": {"schema": {"type": "object", "additionalProperties": True}},
            "text/event-stream": {"schema": {"type": "string"}},
        },
    },
    403: {"model": ErrorResponse, "description": "An auditor key (reads only)."},
    404: {
        "model": ErrorResponse,
        "description": "Unknown model (`model_not_found`), or one the key may not use.",
    },
    413: {"model": ErrorResponse, "description": "Request body over the size limit."},
    502: {"model": ErrorResponse, "description": "The upstream could not be reached."},
    504: {"model": ErrorResponse, "description": "The upstream sent no answer in time."},
}


@router.get("/models", response_model=ModelList)
async def list_models(settings: SettingsDep, identity: IdentityDep) -> ModelList:
    return ModelList(data=[ModelObject(id=m.id) for m in settings.models if identity.can_use(m.id)])


@router.get(
    "/models/{model_id:path}", response_model=ModelObject, responses={404: {"model": ErrorResponse}}
)
async def retrieve_model(
    model_id: str, settings: SettingsDep, identity: IdentityDep
) -> ModelObject:
    return ModelObject(id=_model_or_404(settings, model_id, identity).id)


def _live_route(spec: EndpointSpec) -> Callable[..., Awaitable[Response]]:
    async def forward(
        request: Request, settings: SettingsDep, identity: WriterDep, http: HttpDep, live: LiveDep
    ) -> Response:
        slot = take_live_slot(request, identity.workspace)  # 429 at the workspace's cap
        try:
            return slot.until_sent(await _forward(request, spec, settings, identity, http, live))
        except BaseException:
            slot.release()
            raise

    forward.__name__ = spec.path.removeprefix("/v1/").replace("/", "_")
    return forward


def _responses(spec: EndpointSpec) -> dict[int | str, dict[str, Any]]:
    if spec.streams:
        return _LIVE_RESPONSES
    ok = {**_LIVE_RESPONSES[200], "description": "The upstream's answer, relayed as it arrives."}
    ok["content"] = {"application/json": ok["content"]["application/json"]}
    return {**_LIVE_RESPONSES, 200: ok}


for _spec in REGISTRY.values():  # the live proxy's routes: every endpoint the registry serves live
    if _spec.live:
        router.add_api_route(
            _spec.path.removeprefix("/v1"),
            _live_route(_spec),
            methods=["POST"],
            response_model=None,
            responses=_responses(_spec),
        )


async def _forward(
    request: Request,
    spec: EndpointSpec,
    settings: Settings,
    identity: Identity,
    http: httpx.AsyncClient,
    live: LiveTraffic,
) -> Response:
    rid = request_id(request)
    raw = await _read_body(request, settings.limits.max_line_bytes)
    body = _decoded(raw)
    model = _model_or_404(settings, _model_name(body, spec), identity)
    route = choose_route(model, LIVE_ROUTING_KEY, rid)
    refused = refused_field(spec.path, body, route)
    if refused is not None:
        raise InvalidRequest(
            refusal_message(refused, route), param=refused, code="unsupported_parameter"
        )
    upstream = build_upstream_request(
        http,
        route,
        spec,
        forwarded_body(raw, body, route, endpoint=spec.path),
        rid,
        timeout=httpx.Timeout(settings.limits.line_timeout_seconds, connect=5.0, pool=5.0),
        headers={"accept": request.headers.get("accept", "application/json")},
    )
    journal: UsageJournal | None = getattr(request.app.state, "usage", None)

    payer = UsageAccount(
        workspace=identity.workspace,
        key_id=identity.key_id or None,
        model=model.id,
        route=route.id,
        service_class="live",
    )

    def account(status: str, prompt_tokens: int, completion_tokens: int) -> None:
        if journal is not None:
            journal.record(payer.entry(rid, status, prompt_tokens, completion_tokens))

    terms = RelayTerms(
        route=route.id,
        workspace=identity.workspace,
        share=settings.workspace_limits(identity.workspace).max_live_counted,
        buffer_bytes=settings.limits.live_buffer_bytes,
        stall_seconds=settings.limits.live_stall_seconds,
    )
    budget: RelayBudget = request.app.state.live_budget
    usage_buffers: ByteBudget | None = getattr(request.app.state, "usage_buffers", None)
    claim = usage_buffers.claim(identity.workspace) if usage_buffers is not None else None
    return UpstreamResponse(http, upstream, live, terms, budget, account, spec.usage, claim)


async def _read_body(request: Request, limit: int) -> bytes:
    """The whole body, refused as soon as it is known to be over `limit` bytes."""
    too_large = PayloadTooLarge(
        f"The request body is larger than the {limit}-byte limit.", code="request_too_large"
    )
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise too_large
    return bytes(body)


def _decoded(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, decoded strictly (`backfill.platform.strict_json`: no NaN,
    Infinity or 1e999, at most `MAX_DEPTH` levels), or a 400."""
    try:
        parsed = strict_json.loads(raw, unique_keys=True)
    except ValueError as err:
        msg = f"The request body is not valid JSON: {strict_json.describe(err)}."
        raise InvalidRequest(msg) from None
    if not isinstance(parsed, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    return parsed


def _model_name(body: dict[str, Any], spec: EndpointSpec) -> str:
    model = body.get(spec.model_field)
    if not isinstance(model, str) or not model:
        field = spec.model_field
        raise InvalidRequest(f"Missing required parameter: '{field}'.", param=field)
    return model


def _model_or_404(settings: Settings, name: str, identity: Identity) -> ModelConfig:
    """The model, or 404 when it does not exist or the key may not use it (the same answer)."""
    model = settings.model(name)
    if model is None or not identity.can_use(model.id):
        raise NotFound(
            f"The model `{name}` does not exist or you do not have access to it.",
            param="model",
            code="model_not_found",
        )
    return model


@dataclass(frozen=True)
class RelayTerms:
    """How one live answer is counted and relayed."""

    route: str
    workspace: str = ""
    share: int | None = None
    """The workspace's `max_live_counted`: its most requests counted on the route at once."""
    buffer_bytes: int = 1024 * 1024
    """`limits.live_buffer_bytes`: the most of the answer read ahead of the client."""
    stall_seconds: float = 30.0
    """`limits.live_stall_seconds`: a client that takes nothing this long is cut."""


class UpstreamResponse(Response):
    """Sends `upstream` and relays its answer; counted in flight on the route meanwhile.

    The whole exchange runs inside this ASGI call. The route's count (`LiveTraffic.take`) ends
    as soon as the model server's side does: the answer read whole into the relay buffer
    (`api.live.relay`), upstream failure, the client gone (watched on `receive`, which also
    closes the upstream request), or cancellation; the client may still be reading then. A
    client that takes nothing for `stall_seconds` is cut (`api.live.connection_cut`) and the
    upstream request closed."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        upstream: httpx.Request,
        live: LiveTraffic,
        terms: RelayTerms,
        budget: RelayBudget,
        account: Callable[[str, int, int], None] | None = None,
        usage: UsageFields = CHAT_USAGE,
        usage_claim: Claim | None = None,
    ) -> None:
        super().__init__()
        self.http, self.upstream, self.live, self.terms = http, upstream, live, terms
        self.route = terms.route
        self.budget = budget
        self.started = time.monotonic()
        self.account = account
        """Journals the attempt: (status or error code, prompt tokens, completion tokens)."""
        self.status = "client_closed"
        self.usage = usage
        """Where the endpoint's answers keep their usage."""
        self.reader: UsageReader | None = None
        self.count: LiveCount | None = None
        self.usage_claim = usage_claim
        """The workspace's claim on the process's usage budget, for the reader."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.started = time.monotonic()
        rid = self.upstream.headers.get("x-request-id", "")
        with tracing.upstream_span(self.upstream.url.path, self.route, rid) as span:
            tracing.inject(self.upstream.headers)  # this span is the upstream's parent
            try:
                await self._counted(scope, receive, send)
            finally:
                code = int(self.status) if self.status.isdigit() else None
                tracing.answered(span, code, None if code else self.status)
                self._finished()

    def _finished(self) -> None:
        """The attempt's journal entry and total time, however it ended."""
        if self.account is not None:
            self.account(self.status, *(self.reader.tokens() if self.reader else (0, 0)))
        LIVE_REQUEST_SECONDS.labels(self.route, "total").observe(time.monotonic() - self.started)

    async def _counted(self, scope: Scope, receive: Receive, send: Send) -> None:
        t = self.terms
        with self.live.in_flight(t.route, t.workspace, t.share) as self.count:
            async with anyio.create_task_group() as tasks:

                async def until_disconnect() -> None:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    tasks.cancel_scope.cancel()

                tasks.start_soon(until_disconnect)
                cut_off = False
                try:
                    cut_off = await self._relay(send)
                finally:
                    if cut_off and cut(scope):
                        self.count.release()
                        # The reset reaches `until_disconnect` at once, which ends the exchange
                        # (uvicorn then knows the client is gone: nothing to close, nothing
                        # logged).
                        with anyio.move_on_after(CUT_HEARD_WITHIN_SECONDS):
                            await anyio.sleep_forever()
                    tasks.cancel_scope.cancel()

    async def _send(self, send: Send, message: Message) -> bool:
        """Send `message` to the client; False when the client took nothing for
        `stall_seconds` (it is then to be cut)."""
        with anyio.move_on_after(self.terms.stall_seconds):
            await send(message)
            return True
        log.warning(
            "live client on %s read nothing for %.0f s: cut", self.route, self.terms.stall_seconds
        )
        CLIENTS_CUT.labels(self.route).inc()
        return False  # the status stays the upstream's, as for a client that leaves mid-answer

    def _upstream_done(self) -> None:
        """The model server's side is over: the route stops counting this request."""
        if self.count is not None:
            self.count.release()

    async def _relay(self, send: Send) -> bool:
        """Relays the answer; True when the client stalled and is to be cut."""
        try:
            resp = await self.http.send(self.upstream, stream=True)
        except httpx.PoolTimeout as err:
            self.status = "gateway_busy"
            self._upstream_done()
            await _send_error(send, _gateway_error(503, "is busy", err, "gateway_busy"))
            return False
        except httpx.TimeoutException as err:
            self.status = "upstream_timeout"
            self._upstream_done()
            await _send_error(
                send, _gateway_error(504, "did not answer in time", err, "upstream_timeout")
            )
            return False
        except httpx.HTTPError as err:
            self.status = "upstream_unavailable"
            self._upstream_done()
            await _send_error(
                send, _gateway_error(502, "could not be reached", err, "upstream_unavailable")
            )
            return False
        self.status = str(resp.status_code)
        try:
            if resp.status_code >= 400:
                await self._relay_error(resp, send)
                return False
            headers = [(k, v) for k, v in resp.headers.raw if k.lower() not in _HOP_BY_HOP]
            start = {"type": "http.response.start", "status": resp.status_code, "headers": headers}
            if not await self._send(send, start):
                return True
            content_type = resp.headers.get("content-type", "")
            self.reader = UsageReader(content_type, self.usage, self.usage_claim)
            buffer = RelayBuffer(self.terms.buffer_bytes, self.budget)
            stalled = False
            async with anyio.create_task_group() as reading:
                reading.start_soon(self._read, resp, buffer, content_type)
                try:
                    stalled = await self._write(send, buffer)
                finally:
                    reading.cancel_scope.cancel()  # the client stalled or left: stop reading
                    buffer.close()
            return stalled
        finally:
            await resp.aclose()

    async def _write(self, send: Send, buffer: RelayBuffer) -> bool:
        """Sends the answer on to the client as `_read` buffers it; True when the client
        stalled."""
        while (chunk := await buffer.get()) is not None:
            more = {"type": "http.response.body", "body": chunk, "more_body": True}
            if not await self._send(send, more):
                return True
        if not buffer.complete:
            return False  # too late for a status: end without completing, so the client sees it
        return not await self._send(send, {"type": "http.response.body", "body": b""})

    async def _read(self, resp: httpx.Response, buffer: RelayBuffer, content_type: str) -> None:
        """Reads the whole answer into `buffer` (as the client takes it, past its bound), then
        uncounts the request."""
        assert self.reader is not None
        streamed = content_type.startswith("text/event-stream")
        complete = False
        try:
            first = True
            async for chunk in resp.aiter_raw():
                if chunk:
                    self.reader.feed(chunk)
                    if first:  # time to first token, for a stream
                        first = False
                        ttft = time.monotonic() - self.started
                        LIVE_REQUEST_SECONDS.labels(self.route, "ttft").observe(ttft)
                        if streamed:
                            self.live.record_ttft(self.route, ttft)
                    await buffer.put(chunk)
            complete = True
        except httpx.HTTPError as err:
            log.warning("upstream %s broke off mid-response: %s", self.route, err)
        finally:
            buffer.end(complete=complete)
            self._upstream_done()

    async def _relay_error(self, resp: httpx.Response, send: Send) -> None:
        """An upstream error status: its body if it is OpenAI's envelope, else wrapped in one."""
        body = bytearray()
        try:
            async for chunk in resp.aiter_bytes():
                body += chunk
                if len(body) > ERROR_BODY_LIMIT:
                    break
        except httpx.HTTPError as err:
            log.warning("upstream %s error body unreadable: %s", self.route, err)
        self._upstream_done()
        extra = [(b"retry-after", v.encode()) for v in resp.headers.get_list("retry-after")]
        status = resp.status_code
        if len(body) <= ERROR_BODY_LIMIT and _is_envelope(bytes(body)):
            await _send_json(send, status, bytes(body), extra)
        else:
            await _send_json(send, status, _wrap(status, bytes(body)), extra)


def _is_envelope(body: bytes) -> bool:
    try:
        parsed = strict_json.loads(body, finite=False)
    except ValueError:
        return False
    err = parsed.get("error") if isinstance(parsed, dict) else None
    return isinstance(err, dict) and isinstance(err.get("message"), str)


def _wrap(status: int, body: bytes) -> bytes:
    """OpenAI's envelope around an upstream error body that is not one (vLLM's older flat
    `{"object": "error", "message", ...}` keeps its fields; anything else is quoted)."""
    try:
        parsed: Any = strict_json.loads(body, finite=False)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("message"), str):
        param, code = parsed.get("param"), parsed.get("code")
        detail = {
            "message": parsed["message"],
            "type": str(parsed.get("type") or _error_type(status)),
            "param": param if isinstance(param, str) else None,
            "code": code if isinstance(code, str | int) else None,
        }
    else:
        text = body[:500].decode("utf-8", errors="replace").strip()
        detail = {
            "message": f"The model server answered {status}" + (f": {text}" if text else "."),
            "type": _error_type(status),
            "param": None,
            "code": "upstream_error",
        }
    return json.dumps({"error": detail}).encode()


def _error_type(status: int) -> str:
    return "server_error" if status >= 500 else "invalid_request_error"


def _gateway_error(status: int, what: str, err: Exception, code: str) -> APIError:
    log.warning("live request: the model server %s: %r", what, err)
    error = APIError(f"The model server {what} ({type(err).__name__}).", code=code)
    error.status, error.type = status, "server_error"
    return error


async def _send_error(send: Send, err: APIError) -> None:
    await _send_json(send, err.status, json.dumps(err.body()).encode())


async def _send_json(
    send: Send, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *(extra or []),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})
