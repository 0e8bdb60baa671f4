"""Cutting a client's connection from inside the app: the ASGI extension `backfill.cut`.

An ASGI app that returns without finishing its response gets the connection closed by uvicorn,
but a close waits until the bytes already written have reached the client: a client that reads
nothing keeps the socket (one of `BACKFILL_API_MAX_CONCURRENCY`) and its buffers forever. The
api serves with `CuttableH11Protocol`, uvicorn's h11 protocol that puts a cut in every request's
scope (`scope["extensions"]["backfill.cut"]`); `cut(scope)` calls it: the socket is closed at
once with a TCP reset (a zero `SO_LINGER`, so neither the process nor the kernel keeps what was
unsent), and the app's `receive` answers `http.disconnect`. Served otherwise (a test's
in-process transport), `cut` does nothing and says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

CUT_EXTENSION = "backfill.cut"


class CuttableH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, its requests' scopes carrying `backfill.cut`."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.app = _with_cut(self.app, lambda: _reset(transport))


def _reset(transport: asyncio.Transport) -> None:
    """Closes the connection with a reset: with a zero linger the kernel drops the unsent bytes
    at once instead of holding them (and the client's connection open) for a client that reads
    nothing."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


def _with_cut(app: ASGIApp, abort: Callable[[], None]) -> ASGIApp:
    async def with_cut(scope: Scope, receive: Receive, send: Send) -> None:
        extensions: dict[str, Any] = scope.setdefault("extensions", {})
        extensions[CUT_EXTENSION] = abort
        await app(scope, receive, send)

    return with_cut


def cut(scope: Scope) -> bool:
    """Close the client's connection at once; False when the server offers no way to."""
    abort = (scope.get("extensions") or {}).get(CUT_EXTENSION)
    if abort is None:
        return False
    abort()
    return True
