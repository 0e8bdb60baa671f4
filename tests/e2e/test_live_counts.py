"""Live counts measure the model server, not the client (issue 47): over real HTTP, the api
against the simulator, with raw client sockets that open a stream and never read it.

- A stream whose client reads nothing stops counting on its route once the simulator has sent the
  whole answer (the api holds it for the client, who can still read all of it).
- One workspace counts at most its `max_live_counted` on the route; its requests beyond it are
  still served, and another workspace's still count.
- A client that reads nothing for `limits.live_stall_seconds` is cut (the connection reset, not
  left open) and the upstream request closed.

The api's own live count (`gateway_live_in_flight`) is what the route's scheduler and the
preemption channel are told."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from collections.abc import AsyncIterator

import h11
import pytest
import pytest_asyncio

from tests.conftest import TemporalServer
from tests.e2e.stack import Stack, live_in_flight, route_metric
from tests.polling import poll_until
from tools.sim import SimConfig
from tools.sim.stats import ABORTED

SHARE = 2
"""alpha's `max_live_counted` on the buffering stack."""
MSG = [{"role": "user", "content": "one two three four five six seven eight"}]
TCP_CLOSE, TCP_CLOSE_WAIT = 7, 8
"""Linux's `tcpi_state` of a socket that got a reset (or closed), and of one that got a FIN."""


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def buffering(
    tmp_path_factory: pytest.TempPathFactory, dev_server: TemporalServer
) -> AsyncIterator[Stack]:
    """A relay buffer larger than the test's answer, and a stall timeout far off."""
    sim = SimConfig(model_names=[], latency_ms=5)
    s = Stack(
        tmp_path_factory.mktemp("live-counts"),
        dev_server.address,
        sim=sim,
        limits={"live_buffer_bytes": 16 * 1024 * 1024, "live_stall_seconds": 300.0},
        workspace_limits={"alpha": {"max_live_counted": SHARE}},
    )
    async with s.running(workers=0):  # the api and the simulator: no batch here
        yield s


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def stalling(
    tmp_path_factory: pytest.TempPathFactory, dev_server: TemporalServer
) -> AsyncIterator[Stack]:
    """The smallest relay buffer and a 2 s stall timeout; the simulator streams slowly."""
    sim = SimConfig(model_names=[], latency_ms=5, stream_token_delay_ms=10)
    s = Stack(
        tmp_path_factory.mktemp("live-stall"),
        dev_server.address,
        sim=sim,
        limits={"live_buffer_bytes": 64 * 1024, "live_stall_seconds": 2.0},
    )
    async with s.running(workers=0):
        yield s


REPLY_EVENTS = 18
"""The simulator's streamed choice: its role, "Simulated" and the prompt's first 15 words (the
reply's 16 tokens), its finish."""


def long_chat(word_chars: int, n: int) -> bytes:
    """A streamed chat whose answer is `n` choices of 15 words of `word_chars` characters and
    "Simulated" (an SSE event per word)."""
    prompt = " ".join(f"{i:06d}".ljust(word_chars, "x") for i in range(15))
    body = {
        "model": "demo",
        "messages": [{"role": "user", "content": prompt}],
        "stream": True,
        "n": n,
    }
    return json.dumps(body).encode()


async def open_unread(stack: Stack, key: str, body: bytes) -> socket.socket:
    """A raw connection that sends the request and reads nothing (a 4 KiB receive buffer)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, ("127.0.0.1", stack.api_port))
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{stack.api_port}\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    await loop.sock_sendall(sock, head + body)
    return sock


async def cuts(stack: Stack) -> float:
    """The api's `gateway_live_clients_cut_total` of the stack's route (0 before the first)."""
    return await route_metric(stack, "gateway_live_clients_cut_total") or 0.0


def tcp_state(sock: socket.socket) -> int:
    """The connection's state as the kernel has it (`tcpi_state`, Linux)."""
    return struct.unpack("B", sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[:1])[0]


async def read_response(sock: socket.socket, within: float) -> tuple[int, bytes]:
    """Reads the whole HTTP response off `sock`: (status, body)."""
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))  # only its state
    conn.send(h11.EndOfMessage())
    loop = asyncio.get_running_loop()
    status, body = 0, bytearray()
    async with asyncio.timeout(within):
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await loop.sock_recv(sock, 256 * 1024))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                return status, bytes(body)
            elif isinstance(event, h11.ConnectionClosed):
                raise AssertionError(f"the api closed after {len(body)} bytes of the answer")


async def test_a_client_that_reads_nothing_stops_counting_once_the_answer_is_in(
    buffering: Stack,
) -> None:
    sim = buffering.sim.app
    served = sim.stats_dict()["live"]["requests_total"]
    # 40 choices of 15 words of 10,000 characters: about 6 MB of SSE, more than loopback's
    # socket buffers take (about 3 MB), so the api's writes to this client block.
    n = 40
    sock = await open_unread(buffering, "sk-test-beta", long_chat(10_000, n))
    try:

        async def state() -> tuple[int, int, float]:
            live = sim.stats_dict()["live"]
            return live["requests_total"], live["concurrent"], await live_in_flight(buffering)

        # The simulator has sent the whole answer, and the route no longer counts it, although
        # the client has read none of it.
        await poll_until(
            state,
            lambda s: s[0] == served + 1 and s[1] == 0 and s[2] == 0,
            timeout=60,
            what="(answers started, answers open at the simulator, api live count) = (+1, 0, 0)",
            interval=0.1,
        )
        assert tcp_state(sock) not in (TCP_CLOSE, TCP_CLOSE_WAIT)  # the client is still served
        # The api held the answer for the client: it still gets every event of it.
        status, body = await read_response(sock, within=60)
    finally:
        sock.close()
    assert status == 200
    events = [e for e in body.split(b"\n\n") if e.startswith(b"data: ")]
    assert len(events) == n * REPLY_EVENTS + 1  # and [DONE]
    assert events[-1] == b"data: [DONE]"


async def test_a_workspace_counts_at_most_its_share_and_others_still_count(
    buffering: Stack,
) -> None:
    sim = buffering.sim.app
    sim.config.stream_token_delay_ms = 100  # n=8 choices of 10 tokens: about 9 s per stream
    alpha, beta = buffering.client("sk-test-alpha"), buffering.client("sk-test-beta")
    streams = []
    try:
        for _ in range(SHARE + 2):
            stream = await alpha.chat.completions.create(
                model="demo",
                messages=MSG,  # type: ignore[arg-type]
                stream=True,
                n=8,
            )
            await anext(aiter(stream))  # every one is served: its first event arrives
            streams.append(stream)
        assert sim.stats_dict()["live"]["concurrent"] == SHARE + 2
        assert await live_in_flight(buffering) == SHARE  # 4 in flight, 2 counted
        other = await beta.chat.completions.create(
            model="demo",
            messages=MSG,  # type: ignore[arg-type]
            stream=True,
            n=8,
        )
        await anext(aiter(other))
        streams.append(other)
        assert await live_in_flight(buffering) == SHARE + 1  # beta's request counts
        await streams[0].close()
        await streams[1].close()
        # alpha still has 2 in flight: its share stays full.
        await poll_until(
            lambda: sim.stats_dict()["live"]["concurrent"],
            lambda c: c == SHARE + 1,
            timeout=10,
            what="alpha's two closed streams ended at the simulator",
        )
        assert await live_in_flight(buffering) == SHARE + 1
    finally:
        for stream in streams:
            await stream.close()
        sim.config.stream_token_delay_ms = 0
    await poll_until(
        lambda: live_in_flight(buffering), lambda v: v == 0, timeout=10, what="live count 0"
    )


async def test_a_client_that_reads_nothing_is_cut_and_the_upstream_closed(
    stalling: Stack,
) -> None:
    sim = stalling.sim.app
    aborted = sim.stats.by_status[ABORTED]
    # 128 choices of 15 words of 20,000 characters, an event every 10 ms or more: 46 MB, 23 s
    # at least. The client's buffers are full within seconds.
    sock = await open_unread(stalling, "sk-test-alpha", long_chat(20_000, 128))
    try:
        await poll_until(
            lambda: sim.stats_dict()["live"]["concurrent"],
            lambda c: c == 1,
            timeout=30,
            what="the stream open at the simulator",
        )

        async def state() -> tuple[int, int, int, float]:
            return (
                tcp_state(sock),
                sim.stats_dict()["live"]["concurrent"],
                sim.stats.by_status[ABORTED] - aborted,
                await live_in_flight(stalling),
            )

        assert await cuts(stalling) == 0
        # Cut: the connection reset while the client still reads nothing (a close would wait
        # for the unsent bytes forever), the simulator told the client left mid-answer, and the
        # live count back at 0.
        await poll_until(
            state,
            lambda s: s[0] == TCP_CLOSE and s[1] == 0 and s[2] == 1 and s[3] == 0,
            timeout=40,
            what="(tcp state, open at the simulator, aborted there, live count) = (CLOSE, 0, 1, 0)",
            interval=0.2,
        )
        assert await cuts(stalling) == 1  # counted for the operator
    finally:
        sock.close()
