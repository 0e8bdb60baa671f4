"""Reading a model server's load from its `/metrics` (the server-load signal, decision 0011).

`ServerLoadReader` is built once per process (in `worker/` and `api/`) with the approved upstream
bases and keeps, per process: the pinned addresses of each metrics host, and each URL's last
reading, reused for `reuse_seconds`. A host name is resolved on first use, again every
`reresolve_seconds` (60 s) and again at the next fetch after a failed one (so a model server that
moved, e.g. a rescheduled pod behind DNS, is found again); a fetch only ever connects to the
addresses of its host's latest resolution, and every resolved address is checked
(`allowed_address`: never link-local such as a cloud metadata endpoint, multicast, unspecified
or reserved). A fetch sends no credentials, follows no redirect, uses no proxy (it
never reads proxy variables: it talks httpcore directly), retries nothing, must finish within
`deadline` seconds including name resolution, and stops reading past `max_bytes`. `read` never
raises: every failure is a `LoadReading` with `error` set, which the gate treats as closed.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any
from urllib.parse import urlsplit

import httpcore

from backfill.platform import metrics
from backfill.routes.gates.server_load import LoadReading
from backfill.upstream.load_metrics import approve_metrics_url, parse_load

__all__ = [
    "PinnedBackend",
    "Resolver",
    "ServerLoadReader",
    "allowed_address",
    "export_reading",
    "resolve_host",
]

DEADLINE_SECONDS = 2.0
RERESOLVE_SECONDS = 60.0
MAX_BYTES = 1024 * 1024
REUSE_SECONDS = 5.0

Resolver = Callable[[str, int], Awaitable[list[str]]]
"""(host, port) -> IP addresses to connect to, in order of preference."""


async def resolve_host(host: str, port: int) -> list[str]:
    """The system resolver's addresses for `host` (deduplicated, in its order)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def allowed_address(address: str) -> bool:
    """May a metrics host name resolve to `address`? Never to a link-local address (cloud
    metadata endpoints live there), multicast, unspecified or reserved ones."""
    ip = ipaddress.ip_address(address)
    if ip.is_loopback:  # ::1 counts as reserved
        return True
    return not (ip.is_link_local or ip.is_multicast or ip.is_unspecified or ip.is_reserved)


class _FetchError(Exception):
    """The metrics could not be read; the message says why (shown in the route status)."""


class PinnedBackend(httpcore.AsyncNetworkBackend):
    """Connects only to the addresses pinned for a (host, port); TLS still verifies the host."""

    def __init__(self, pins: dict[tuple[str, int], list[str]]) -> None:
        self._pins = pins
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109  # httpcore backend signature
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        addresses = self._pins.get((host, port))
        if not addresses:
            raise httpcore.ConnectError(f"{host}:{port} has no pinned address")
        failure: Exception | None = None
        for address in addresses:
            try:
                return await self._inner.connect_tcp(
                    address, port, timeout, local_address, socket_options
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as e:
                failure = e
        assert failure is not None
        raise failure

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109  # httpcore backend signature
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("unix sockets are not used")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class ServerLoadReader:
    """Reads approved metrics URLs with pinned addresses and a per-URL reuse cache."""

    def __init__(
        self,
        approved_bases: Iterable[str],
        *,
        resolve: Resolver = resolve_host,
        deadline: float = DEADLINE_SECONDS,
        max_bytes: int = MAX_BYTES,
        reuse_seconds: float = REUSE_SECONDS,
        reresolve_seconds: float = RERESOLVE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.approved_bases = tuple(approved_bases)
        """Upstream base URLs (ending in /v1) whose `/metrics` may be read."""
        self._resolve = resolve
        self._deadline = deadline
        self._max_bytes = max_bytes
        self._reuse = reuse_seconds
        self._clock = clock
        self._wall = wall_clock
        self._reresolve = reresolve_seconds
        self._pins: dict[tuple[str, int], list[str]] = {}
        self._resolved_at: dict[tuple[str, int], float] = {}
        self._cache: dict[str, tuple[float, LoadReading]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._backend = PinnedBackend(self._pins)

    def pinned(self, host: str, port: int) -> list[str] | None:
        """The addresses pinned for (host, port), None before its first fetch."""
        found = self._pins.get((host.lower(), port))
        return list(found) if found is not None else None

    async def read(self, metrics_url: str) -> LoadReading:
        """The load at `metrics_url`: reused if read less than `reuse_seconds` ago, else
        fetched (one fetch at a time per URL). Never raises."""
        try:
            approve_metrics_url(metrics_url, self.approved_bases)
        except ValueError as e:
            return LoadReading(read_at=int(self._wall()), error=str(e))
        lock = self._locks.setdefault(metrics_url, asyncio.Lock())
        async with lock:
            cached = self._cache.get(metrics_url)
            if cached is not None and self._clock() - cached[0] < self._reuse:
                return cached[1]
            reading = await self._fetch(metrics_url)
            if reading.error is not None:
                self._forget(metrics_url)  # the server may have moved: resolve again next time
            self._cache[metrics_url] = (self._clock(), reading)
            return reading

    async def _fetch(self, url: str) -> LoadReading:
        try:
            async with asyncio.timeout(self._deadline):
                body = await self._get(url)
        except TimeoutError:
            return self._failed(url, f"no complete answer within {self._deadline:g} s")
        except _FetchError as e:
            return self._failed(url, str(e))
        except (httpcore.ConnectError, httpcore.ConnectTimeout, OSError) as e:
            return self._failed(url, f"cannot connect: {e or type(e).__name__}")
        except Exception as e:  # protocol errors, resets, anything else: fail closed
            return self._failed(url, f"{type(e).__name__}: {e}")
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            return self._failed(url, "the body is not UTF-8 text")
        reading = parse_load(text, int(self._wall()))
        if reading.error is not None:
            return self._failed(url, reading.error)
        return reading

    def _forget(self, url: str) -> None:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        self._resolved_at.pop(((parts.hostname or "").lower(), port), None)

    def _failed(self, url: str, why: str) -> LoadReading:
        return LoadReading(read_at=int(self._wall()), error=f"GET {url}: {why}")

    async def _get(self, url: str) -> bytes:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        port = parts.port or (443 if parts.scheme == "https" else 80)
        key = (host, port)
        resolved_at = self._resolved_at.get(key)
        if resolved_at is None or self._clock() - resolved_at >= self._reresolve:
            self._pins.pop(key, None)  # never connect to a stale answer, even if this one fails
            self._pins[key] = await self._addresses(host, port)
            self._resolved_at[key] = self._clock()
        timeouts = {k: self._deadline for k in ("connect", "read", "write", "pool")}
        async with (
            httpcore.AsyncConnectionPool(
                network_backend=self._backend, retries=0, max_connections=1
            ) as pool,
            pool.stream(
                "GET",
                url,
                headers=[(b"Accept", b"text/plain"), (b"User-Agent", b"backfill-load-signal")],
                extensions={"timeout": timeouts},
            ) as response,
        ):
            if 300 <= response.status < 400:
                raise _FetchError(f"redirects are not followed (HTTP {response.status})")
            if response.status != 200:
                raise _FetchError(f"HTTP {response.status}")
            for name, value in response.headers:
                if name.lower() == b"content-length" and value.isdigit():
                    if int(value) > self._max_bytes:
                        raise _FetchError(f"body larger than {self._max_bytes} bytes")
            chunks: list[bytes] = []
            size = 0
            async for chunk in response.aiter_stream():
                size += len(chunk)
                if size > self._max_bytes:
                    raise _FetchError(f"body larger than {self._max_bytes} bytes")
                chunks.append(chunk)
            return b"".join(chunks)

    async def _addresses(self, host: str, port: int) -> list[str]:
        try:
            return [str(ipaddress.ip_address(host))]
        except ValueError:
            pass
        try:
            found = await self._resolve(host, port)
        except OSError as e:
            raise _FetchError(f"cannot resolve {host}: {e}") from None
        if not found:
            raise _FetchError(f"cannot resolve {host}: no address")
        allowed = [a for a in found if allowed_address(a)]
        if not allowed:
            raise _FetchError(f"{host} resolves only to addresses not allowed: {', '.join(found)}")
        return allowed


def export_reading(route_id: str, reading: LoadReading) -> None:
    """The reading as `gateway_server_load{provider,signal}`, or one more load error."""
    if reading.error is not None:
        metrics.SERVER_LOAD_ERRORS.labels(route_id).inc()
        return
    for signal, value in (
        ("waiting", reading.waiting),
        ("running", reading.running),
        ("kv_cache_percent", reading.kv_cache_percent),
    ):
        if value is not None:
            metrics.SERVER_LOAD.labels(route_id, signal).set(value)
