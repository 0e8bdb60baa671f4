"""`X-Request-ID` on every request: the client's own if it sent a sane one, else a new one.

A pure ASGI middleware: it stores the id in the request's state (`request.state.request_id`, read
by the live proxy, which passes it upstream) and sets it on every response it lets through."""

from __future__ import annotations

import re
import uuid

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADER = "x-request-id"
_RAW = HEADER.encode()
_ACCEPTED = re.compile(r"[\x21-\x7e]{1,200}")
"""Visible ASCII, bounded: anything else is replaced rather than passed upstream or logged."""


def new_request_id() -> str:
    return f"req_{uuid.uuid4().hex}"


def request_id(request: Request) -> str:
    """This request's id (set by `RequestIdMiddleware`; a fresh one if it did not run)."""
    rid = getattr(request.state, "request_id", None)
    return rid if isinstance(rid, str) else new_request_id()


class RequestIdMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sent = next((v for k, v in scope["headers"] if k == _RAW), b"").decode("latin-1")
        rid = sent if _ACCEPTED.fullmatch(sent) else new_request_id()
        scope.setdefault("state", {})["request_id"] = rid
        value = rid.encode()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != _RAW]
                message = {**message, "headers": [*headers, (_RAW, value)]}
            await send(message)

        await self.app(scope, receive, send_with_id)
