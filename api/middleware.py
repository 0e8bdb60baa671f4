"""ASGI middleware that protects every endpoint before any route, dependency or key check runs.

- `BodyLimit`: a request body over its limit is answered 413 in OpenAI's envelope before it is
  parsed and before authentication does any work; then a missing or unknown API key is answered
  401 before any of the body is read (so an anonymous client cannot make the api buffer one).
  A declared `Content-Length` is checked at once; a body without one (chunked) is read up to
  the limit and replayed to the app. Uploads (`POST /v1/files`) get the file cap plus room for
  the form and are never buffered here: past the limit their `receive` raises `BodyTooLarge`,
  and the upload parser (which also bounds the parts, their headers and fields while
  streaming) answers 413. A body it lets through (for an upload, what the upload holds while it
  streams) is held against the process's buffer budget (`Settings.api_buffer_bytes`, a share
  per workspace: `backfill.tenancy.byte_budget`) until the request is answered; one that does not
  fit is answered 503 `gateway_busy` with `Retry-After` before it is read.
- `CatchAll`: an unexpected exception is answered 500 in the envelope, and the connection stays
  usable. (Starlette's server-error middleware re-raises after sending its 500, and uvicorn then
  drops the connection: the client's next request on it would be reset.)
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from backfill.tenancy.byte_budget import ByteBudget, Claim

log = logging.getLogger(__name__)

UPLOAD_FORM_OVERHEAD = 1 << 20
"""Bytes allowed beyond the file cap for the form's boundaries, headers and small fields."""
BODY_COPIES = 3
"""What a body holds while its request runs, in its size: its bytes, their decoding, and the body
sent on (a live request's upstream request keeps it until the answer ends)."""
BUSY_RETRY_AFTER = "1"
"""Seconds a request refused for the body budget is told to wait (`Retry-After`)."""


def _envelope(message: str, type_: str, code: str | None, param: str | None = None) -> bytes:
    err = {"message": message, "type": type_, "param": param, "code": code}
    return json.dumps({"error": err}).encode()


async def _send_error(
    send: Send, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += extra or []
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class BodyTooLarge(Exception):
    """Raised by a streamed request's `receive` once the body passed its limit."""


@dataclass(frozen=True)
class BodyRule:
    max_bytes: int
    """The largest body accepted."""
    streamed: bool = False
    """The route streams the body itself (uploads): never buffer it here; past the limit its
    `receive` raises `BodyTooLarge` for the route to answer."""
    code: str = "request_too_large"
    param: str | None = None
    message: str = "The request body is too large: the limit here is {max_bytes} bytes."
    held_bytes: int = 0
    """With `streamed`: what the route holds while the body streams through it (an upload's
    part buffer and chunk), claimed from the body budget for the whole request."""
    keyed: bool = True
    """The route needs an API key (`Authorization: Bearer`): one that is missing or unknown is
    answered 401 before any of the body is read (the console's forms use its session instead)."""


class BodyLimit:
    def __init__(
        self,
        app: ASGIApp,
        rule_for: Callable[[str, str], BodyRule],
        key_known: Callable[[str], bool] | None = None,
        budget: ByteBudget | None = None,
        tenant_of: Callable[[str], str] | None = None,
    ) -> None:
        self.app = app
        self.rule_for = rule_for
        """(method, path) -> the rule for that request's body."""
        self.key_known = key_known
        """Whether a presented API key is configured (None: keys are left to the routes)."""
        self.budget = budget
        """The process's budget for the bodies it lets through (None: none)."""
        self.tenant_of = tenant_of
        """A presented key -> whose share of `budget` its bodies take (its workspace)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE"):
            await self.app(scope, receive, send)
            return
        rule = self.rule_for(scope["method"], scope["path"])
        limit = rule.max_bytes
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await self._too_large(send, rule)
            return
        if rule.keyed and self.key_known is not None:
            refused = _key_refused(scope, self.key_known)
            if refused is not None:
                await _send_error(send, 401, _envelope(refused, "invalid_request_error", KEY_CODE))
                return
        with self._claim(scope) as claim:
            if rule.streamed:
                if not claim.resize(rule.held_bytes):
                    await self._busy(send)
                    return
                await self.app(scope, _counting(receive, limit), send)
                return
            await self._buffered(scope, receive, send, rule, declared, claim)

    def _claim(self, scope: Scope) -> Claim:
        """The request's claim on the body budget, in its key's workspace's share."""
        budget = self.budget if self.budget is not None else ByteBudget(1 << 62, 1 << 62)
        token = _bearer(scope)
        tenant = self.tenant_of(token) if token and self.tenant_of is not None else ""
        return budget.claim(tenant)

    async def _buffered(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        rule: BodyRule,
        declared: int | None,
        claim: Claim,
    ) -> None:
        if declared is not None:  # the server holds the client to its Content-Length
            if not claim.resize(BODY_COPIES * declared):
                await self._busy(send)
                return
            await self.app(scope, receive, send)
            return
        # No Content-Length: read (at most limit + 1 bytes) before the app sees anything.
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > rule.max_bytes:
                await self._too_large(send, rule)
                return
            if not claim.resize(BODY_COPIES * size):  # the chunks, joined, decoded
                await self._busy(send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        del chunks
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    @staticmethod
    async def _busy(send: Send) -> None:
        msg = "The gateway holds as many request bodies as it can just now; retry shortly."
        body = _envelope(msg, "server_error", "gateway_busy")
        await _send_error(send, 503, body, [(b"retry-after", BUSY_RETRY_AFTER.encode())])

    @staticmethod
    async def _too_large(send: Send, rule: BodyRule) -> None:
        msg = rule.message.format(max_bytes=rule.max_bytes)
        body = _envelope(msg, "invalid_request_error", rule.code, rule.param)
        await _send_error(send, 413, body)


KEY_CODE = "invalid_api_key"


def _bearer(scope: Scope) -> str:
    """The request's bearer token ("" without one)."""
    header = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
    scheme, _, token = header.decode("latin-1").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _key_refused(scope: Scope, key_known: Callable[[str], bool]) -> str | None:
    """Why the request's API key is refused (the routes' own messages), or None."""
    token = _bearer(scope)
    if not token:
        return "You didn't provide an API key. Send it as 'Authorization: Bearer <key>'."
    if not key_known(token):
        return "Incorrect API key provided."
    return None


def _counting(receive: Receive, limit: int) -> Receive:
    """`receive` that raises `BodyTooLarge` once more than `limit` body bytes came."""
    seen = 0

    async def wrapped() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise BodyTooLarge(limit)
        return message

    return wrapped


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class CatchAll:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking)
        except Exception:
            log.exception("unexpected error on %s %s", scope["method"], scope["path"])
            if started:
                raise  # half a response is out: only closing the connection is honest
            msg = "The server had an error processing your request."
            await _send_error(send, 500, _envelope(msg, "server_error", None))


HSTS = (b"strict-transport-security", b"max-age=31536000")
"""One year; no `includeSubDomains`: the gateway does not speak for its parent domain's hosts."""


class HstsOverHttps:
    """`Strict-Transport-Security` on every answer to a request that came over https: directly,
    or through a trusted proxy's `X-Forwarded-Proto` (uvicorn's `forwarded_allow_ips` sets the
    scheme before the app runs). Over plain http the header would mean nothing."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("scheme") != "https":
            await self.app(scope, receive, send)
            return

        async def send_with_hsts(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), HSTS]
            await send(message)

        await self.app(scope, receive, send_with_hsts)
