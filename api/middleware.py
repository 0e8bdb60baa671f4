"""ASGI middleware that protects every endpoint before any route, dependency or key check runs.

- `BodyLimit`: a request body over its limit is answered 413 in OpenAI's envelope before it is
  parsed and before authentication does any work. A declared `Content-Length` is checked at
  once; a body without one (chunked) is read up to the limit and replayed to the app. Uploads
  (`POST /v1/files`) get the file cap plus room for the form; the upload parser enforces its own
  per-part limits while streaming.
- `CatchAll`: an unexpected exception is answered 500 in the envelope, and the connection stays
  usable. (Starlette's server-error middleware re-raises after sending its 500, and uvicorn then
  drops the connection: the client's next request on it would be reset.)
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)

UPLOAD_FORM_OVERHEAD = 1 << 20
"""Bytes allowed beyond the file cap for the form's boundaries, headers and small fields."""


def _envelope(message: str, type_: str, code: str | None) -> bytes:
    err = {"message": message, "type": type_, "param": None, "code": code}
    return json.dumps({"error": err}).encode()


async def _send_error(send: Send, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    def __init__(self, app: ASGIApp, limit_for: Callable[[str, str], int]) -> None:
        self.app = app
        self.limit_for = limit_for
        """(method, path) -> the largest body accepted, in bytes."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE"):
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope["method"], scope["path"])
        declared = _content_length(scope)
        if declared is not None:
            if declared > limit:
                await self._too_large(send, limit)
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
            if size > limit:
                await self._too_large(send, limit)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    @staticmethod
    async def _too_large(send: Send, limit: int) -> None:
        msg = f"The request body is too large: the limit here is {limit} bytes."
        await _send_error(send, 413, _envelope(msg, "invalid_request_error", "request_too_large"))


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
