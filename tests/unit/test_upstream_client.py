"""The worker's upstream HTTP client (worker/upstream.py) over real loopback connections, and
the heartbeat period of a line (activities/heartbeat.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any, cast

import httpcore
import httpx
import pytest
from temporalio.testing import ActivityEnvironment

from activities.heartbeat import HEARTBEAT_EVERY, heartbeat_period, heartbeating
from tests.polling import poll_until
from tools.sim import SimConfig, SimServer
from worker.upstream import (
    COALESCE_BYTES,
    PER_POOL,
    RECENTLY_USED_S,
    PooledTransport,
    _Stream,
    upstream_client,
)


@pytest.fixture(scope="module")
async def slow_sim() -> AsyncIterator[SimServer]:
    async with SimServer(SimConfig(model_names=[], latency_ms=400, max_num_seqs=64)) as server:
        yield server


def chat() -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


async def test_requests_fill_the_pools_in_order_and_give_their_slot_back(
    slow_sim: SimServer,
) -> None:
    async with upstream_client() as http:
        transport = http._transport
        assert isinstance(transport, PooledTransport)
        url = f"{slow_sim.url}/v1/chat/completions"
        n = 2 * PER_POOL + 3
        calls = [asyncio.create_task(http.post(url, json=chat())) for _ in range(n)]
        opened = await poll_until(
            lambda: list(transport._open),
            lambda o: sum(o) == n,
            timeout=10,
            what=f"{n} requests open",
            interval=0.01,
        )
        assert opened[:3] == [PER_POOL, PER_POOL, 3] and not any(opened[3:])
        answers = await asyncio.gather(*calls)
        assert [r.status_code for r in answers] == [200] * n
        assert transport._open == [0] * len(transport._open)
        # A quiet route keeps using the first pool (its warm connections), not the others.
        for _ in range(3):
            assert (await http.post(url, json=chat())).status_code == 200
        assert transport._open == [0] * len(transport._open)


async def test_a_failed_request_gives_its_slot_back() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    async with upstream_client() as http:
        transport = http._transport
        assert isinstance(transport, PooledTransport)
        with pytest.raises(httpx.ConnectError):
            await http.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=chat())
        assert transport._open == [0] * len(transport._open)


async def test_a_connection_the_server_closed_while_idle_is_not_reused() -> None:
    """The server answers each request and then closes the connection without saying so: the
    pool must see the idle socket is readable (EOF) and open a new one for the next request."""
    connections = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        await reader.readexactly(length)
        body = b'{"ok":true}'
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        await writer.drain()
        writer.close()  # idle keep-alive connection closed by the server

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, upstream_client(keepalive_seconds=30) as http:
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        assert (await http.post(url, json=chat())).json() == {"ok": True}
        transport = http._transport
        assert isinstance(transport, PooledTransport)
        pool = transport._pools[0]._pool
        # The check the pool makes before reusing a connection (once the server's FIN is in).
        await poll_until(
            lambda: [c.has_expired() for c in pool.connections],
            all,  # expired, or already dropped by the pool
            timeout=5,
            what="the idle connection to show the server closed it",
            interval=0.01,
        )
        assert (await http.post(url, json=chat())).json() == {"ok": True}
        assert connections == 2


async def test_a_cookie_from_one_answer_is_not_sent_with_the_next_line() -> None:
    seen: list[str | None] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return
            lines = head.decode().split("\r\n")
            headers = {k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
            await reader.readexactly(int(headers.get("content-length", "0")))
            seen.append(headers.get("cookie"))
            writer.write(
                b"HTTP/1.1 200 OK\r\nSet-Cookie: tenant=alpha; Path=/\r\n"
                b"Content-Length: 2\r\n\r\n{}"
            )
            await writer.drain()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, upstream_client() as http:
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        for _ in range(2):
            assert (await http.post(url, json=chat())).status_code == 200
    assert seen == [None, None]


def test_a_connections_idle_check_sees_data_eof_and_close() -> None:
    a, b = socket.socketpair()
    stream = _Stream(cast(Any, None), a)  # the check reads the socket, never the inner stream

    def readable() -> bool:
        stream._used = time.monotonic() - RECENTLY_USED_S  # idle long enough to be polled
        return bool(stream.get_extra_info("is_readable"))

    with a, b:
        assert not readable()
        b.send(b"x")
        assert readable()
        a.recv(1)
        assert not readable()
        b.close()
        assert readable()  # EOF: the server closed it
    assert readable()  # closed on our side


@pytest.mark.parametrize(("seconds", "period"), [(7.0, 3.5), (60.0, 30.0), (None, None)])
def test_a_heartbeat_every_half_heartbeat_timeout(
    seconds: float | None, period: float | None
) -> None:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(
        env.info, heartbeat_timeout=timedelta(seconds=seconds) if seconds else None
    )
    assert env.run(heartbeat_period) == (period if period is not None else HEARTBEAT_EVERY)


async def test_a_waiting_activity_heartbeats_every_period_and_stops_when_done() -> None:
    beats: list[float] = []
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, heartbeat_timeout=timedelta(seconds=0.2))
    env.on_heartbeat = lambda *_: beats.append(time.monotonic())

    async def line() -> int:
        start = time.monotonic()
        async with heartbeating():
            await asyncio.sleep(0.45)  # the upstream's answer, slower than two periods
        done = len(beats)
        await asyncio.sleep(0.3)  # after the answer: no more heartbeats
        assert len(beats) == done
        assert all(b - start >= 0.1 for b in beats)  # none at once
        return done

    assert await env.run(line) >= 2  # at 0.1 s (half of 0.2 s) and 0.2 s, ... while it waited


def test_a_connection_used_a_moment_ago_is_not_polled() -> None:
    a, b = socket.socketpair()
    with a, b:
        stream = _Stream(cast(Any, None), a)
        b.close()  # EOF waiting, but the connection was made just now
        assert stream.get_extra_info("is_readable") is False
        stream._used -= RECENTLY_USED_S
        assert stream.get_extra_info("is_readable") is True


class _Recorder(httpcore.AsyncNetworkStream):
    """An inner stream that records what reaches the socket."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109
        return b"HTTP/1.1 200 OK\r\n"

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109
        self.writes.append(buffer)

    async def aclose(self) -> None:
        return None


async def test_a_request_goes_out_in_one_write() -> None:
    inner = _Recorder()
    stream = _Stream(inner, None)
    await stream.write(b"POST / HTTP/1.1\r\nContent-Length: 2\r\n\r\n")
    await stream.write(b"{}")
    assert inner.writes == []  # held until the request is whole
    await stream.write(b"")  # h11's end of a body of known length
    assert inner.writes == [b"POST / HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}"]
    # without that end (a chunked body), the first read sends what is held
    await stream.write(b"0\r\n\r\n")
    assert await stream.read(100) == b"HTTP/1.1 200 OK\r\n"
    assert inner.writes[-1] == b"0\r\n\r\n"
    # a large body is not held back
    big = b"x" * COALESCE_BYTES
    await stream.write(big)
    assert inner.writes[-1] == big


async def test_requests_through_the_client_arrive_whole() -> None:
    """Many requests with bodies of every size on few connections: the server reads each
    request's head and body as sent, and answers every one."""
    bodies: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            body = await reader.readexactly(length)
            bodies.append(body)
            reply = b'{"n":%d}' % len(body)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(reply), reply))
            await writer.drain()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    sizes = [0, 1, 100, COALESCE_BYTES - 300, COALESCE_BYTES, 3 * COALESCE_BYTES + 7] * 4
    async with server, upstream_client() as http:
        url = f"http://127.0.0.1:{port}/v1/chat/completions"

        async def one(n: int) -> int:
            resp = await http.post(url, content=b"a" * n)
            return int(resp.json()["n"])

        assert await asyncio.gather(*(one(n) for n in sizes)) == sizes
    assert sorted(len(b) for b in bodies) == sorted(sizes)
