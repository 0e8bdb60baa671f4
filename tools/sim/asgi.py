"""Raw ASGI helpers of the simulator: vLLM-shaped JSON answers and errors, the request body, and
work that stops when the client goes away (as vLLM aborts a request whose connection closes)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from starlette.types import Receive, Send

from tools.sim.gpu_reply import dumps

Header = tuple[bytes, bytes]
_ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    408: "TimeoutError",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
    500: "InternalServerError",
    502: "BadGatewayError",
    503: "ServiceUnavailableError",
    504: "GatewayTimeoutError",
}


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    return {
        "error": {
            "message": message,
            "type": _ERROR_TYPES.get(status, "APIError"),
            "param": param,
            "code": status,
        }
    }


async def send_body(
    send: Send, status: int, body: bytes, ctype: bytes, headers: Sequence[Header] = ()
) -> int:
    hdrs = [(b"content-type", ctype), (b"content-length", b"%d" % len(body)), *headers]
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": body})
    return status


async def send_json(send: Send, status: int, obj: Any, headers: Sequence[Header] = ()) -> int:
    body = dumps(obj)
    return await send_body(send, status, body, b"application/json", headers)


async def read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b""
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def until_disconnect(
    work_coro: Awaitable[None], receive: Receive, on_orphan: Callable[[], None] | None = None
) -> bool:
    """Run ``work_coro`` unless the client goes away first (like vLLM aborting the request)."""
    work = asyncio.ensure_future(work_coro)
    watch = asyncio.ensure_future(wait_disconnect(receive))
    try:
        done, _ = await asyncio.wait((work, watch), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        watch.cancel()
        if work.done() and not work.cancelled() and work.exception() is None and on_orphan:
            on_orphan()
        work.cancel()
        raise
    watch.cancel()
    if work in done:
        work.result()
        return True
    work.cancel()
    return False
