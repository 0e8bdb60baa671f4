"""The worker's HTTP client for model servers, tuned for hundreds of lines in flight.

Two costs of httpx/httpcore grow with the connections of one pool, and at 256 lines in flight
they were the largest share of the worker's CPU per line (docs/performance.md):

- on every request it sends and every response it closes, httpcore's pool checks each of its
  idle connections for expiry; for each one the anyio stream builds a dict of socket
  attributes (with a `getpeername` system call) only to find the socket. `_Stream` answers
  that check from the socket it keeps;
- that pass is proportional to the pool's connections: `PooledTransport` keeps several small
  pools and fills them in order, so a pool never holds more than about `PER_POOL` requests
  and a route with few lines in flight keeps reusing the same warm connections.

And two system calls per request that cost most at high rates (each send on loopback also
wakes the server): `_Stream` sends a request's head and body in one write, and answers the
expiry check of a connection used in the last `RECENTLY_USED_S` without polling its socket.
"""

from __future__ import annotations

import select
import socket
import ssl
import time
from collections.abc import AsyncIterator, Iterable
from typing import Any

import httpcore
import httpx

UPSTREAM_POOLS = 32
"""Connection pools of the upstream client (256 lines in flight: `PER_POOL` each)."""
PER_POOL = 8
"""Requests a pool takes before the next one is used (when every pool has this many, the
least busy one takes the request)."""
COALESCE_BYTES = 64 * 1024
"""Bytes of a request a connection holds back to send in one write with the rest of it."""
RECENTLY_USED_S = 0.05
"""A connection that sent or received within this many seconds is taken as still open without
polling its socket. A server closes an idle keep-alive connection after seconds, not
milliseconds; a close that lands in this window shows as a request the server never answered,
which `LineActivities` sends again at once (the keep-alive race it already handles)."""


class _Stream(httpcore.AsyncNetworkStream):
    """anyio's stream, with `is_readable` answered from the socket kept at connect time, and a
    request's writes sent together.

    httpcore writes a request's head, its body and an empty end-of-message (h11's, for a body
    of known length) one by one; the writes are held and sent as one when the empty one comes,
    before any read, or past `COALESCE_BYTES`."""

    def __init__(self, inner: httpcore.AsyncNetworkStream, sock: socket.socket | None) -> None:
        self._inner = inner
        self._sock = sock
        self._poll: Any = None
        """A poll set of this socket alone, made once (the check runs many times a request)."""
        if sock is not None and sock.fileno() >= 0:
            self._poll = select.poll()
            self._poll.register(sock.fileno(), select.POLLIN)
        self._held: list[bytes] = []
        self._held_bytes = 0
        self._used = time.monotonic()
        """When this connection last sent or received."""

    async def _flush(self, timeout: float | None) -> None:  # noqa: ASYNC109
        if not self._held:
            return
        data = self._held[0] if len(self._held) == 1 else b"".join(self._held)
        self._held.clear()
        self._held_bytes = 0
        await self._inner.write(data, timeout)

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109
        await self._flush(timeout)
        data = await self._inner.read(max_bytes, timeout)
        self._used = time.monotonic()
        return data

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109
        if buffer:
            self._held.append(buffer)
            self._held_bytes += len(buffer)
            if self._held_bytes < COALESCE_BYTES:
                return
        await self._flush(timeout)
        self._used = time.monotonic()

    async def aclose(self) -> None:
        self._held.clear()
        self._held_bytes = 0
        await self._inner.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109  # httpcore backend signature
    ) -> httpcore.AsyncNetworkStream:
        await self._flush(timeout)
        tls = await self._inner.start_tls(ssl_context, server_hostname, timeout)
        return _Stream(tls, self._sock)

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable" and self._sock is not None:
            # True if the socket has data or EOF waiting (an idle keep-alive connection the
            # server closed) or is closed already; one `poll` system call, skipped for a
            # connection used a moment ago.
            if self._sock.fileno() < 0 or self._poll is None:
                return True
            if time.monotonic() - self._used < RECENTLY_USED_S:
                return False
            return bool(self._poll.poll(0))
        return self._inner.get_extra_info(info)


class _Backend(httpcore.AsyncNetworkBackend):
    """httpcore's anyio backend, handing out `_Stream`s."""

    def __init__(self) -> None:
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109  # httpcore backend signature
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        stream = await self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        return _Stream(stream, stream.get_extra_info("socket"))

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109  # httpcore backend signature
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        stream = await self._inner.connect_unix_socket(path, timeout, socket_options)
        return _Stream(stream, stream.get_extra_info("socket"))

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class _Pool(httpx.AsyncHTTPTransport):
    """httpx's transport over an httpcore pool that uses `_Backend` (httpx has no parameter
    for the network backend: the pool it built is replaced by one that has it)."""

    def __init__(self, limits: httpx.Limits, ssl_context: ssl.SSLContext) -> None:
        super().__init__(verify=ssl_context, limits=limits)
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=ssl_context,
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=_Backend(),
        )


class _Counted(httpx.AsyncByteStream):
    """A response body that gives its pool's request slot back when closed."""

    def __init__(self, inner: httpx.AsyncByteStream, release: Any) -> None:
        self._inner = inner
        self._release = release

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            yield chunk

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            release, self._release = self._release, None
            if release is not None:
                release()


class PooledTransport(httpx.AsyncBaseTransport):
    """Several independent httpx connection pools, filled in order.

    A request goes to the first pool with fewer than `per_pool` requests open (sent and their
    body not yet closed), else to the least busy pool. httpcore's per-request bookkeeping is
    proportional to one pool's connections; with `pools` × `per_pool` ≥ the lines in flight,
    no pool holds more than `per_pool` of them, and a quiet route uses only the first pool (its
    connections stay warm instead of spreading over every pool)."""

    def __init__(self, pools: int, per_pool: int, limits: httpx.Limits) -> None:
        ctx = httpx.create_ssl_context()  # one for all: building one takes milliseconds
        self._pools = [_Pool(limits, ctx) for _ in range(pools)]
        self._open = [0] * pools
        self._per_pool = per_pool

    def _pick(self) -> int:
        for i, n in enumerate(self._open):
            if n < self._per_pool:
                return i
        return min(range(len(self._open)), key=self._open.__getitem__)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        i = self._pick()
        self._open[i] += 1
        try:
            response = await self._pools[i].handle_async_request(request)
        except BaseException:
            self._open[i] -= 1
            raise

        def release() -> None:
            self._open[i] -= 1

        assert isinstance(response.stream, httpx.AsyncByteStream)
        response.stream = _Counted(response.stream, release)
        return response

    async def aclose(self) -> None:
        for pool in self._pools:
            await pool.aclose()


class _NoCookies(httpx.Cookies):
    """A cookie jar that keeps nothing."""

    def extract_cookies(self, response: httpx.Response) -> None:
        return None


class UpstreamClient(httpx.AsyncClient):
    """httpx's client without a cookie jar: a cookie set in one line's answer is never sent
    with another line (lines of every workspace share this client), and each response skips
    httpx's cookie parsing (a tenth of the client's CPU per request at 256 lines in flight)."""

    @property  # type: ignore[override]
    def cookies(self) -> httpx.Cookies:
        return _NoCookies()

    @cookies.setter
    def cookies(self, cookies: Any) -> None:
        return None


def upstream_client(keepalive_seconds: float = 2.0) -> httpx.AsyncClient:
    """The httpx client for model servers: pooled, no redirects, no proxies from the env.

    Idle connections are kept `keepalive_seconds` (settings.upstream_keepalive_seconds), less
    than the servers' own keep-alive timeout, so a line is rarely sent on a connection the server
    is closing (LineActivities sends such a request again at once)."""
    limits = httpx.Limits(
        max_connections=None,
        max_keepalive_connections=PER_POOL,
        keepalive_expiry=keepalive_seconds,
    )
    return UpstreamClient(
        transport=PooledTransport(UPSTREAM_POOLS, PER_POOL, limits),
        follow_redirects=False,
        trust_env=False,
    )
