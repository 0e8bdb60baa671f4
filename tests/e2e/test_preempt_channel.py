"""Preemptive yield's channel trusts nothing it does not need (issue 34, item 4), on a real
worker process: whoever holds the token (or reaches the port) can send live counts, but cannot
set a route's policy, send unbounded values, name routes that are not configured, grow the
worker's memory with made-up processes, or take the HTTP server's threads with slow or many
connections; a malformed request is answered 400."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio

from backfill.preemption.signing import sign
from tests.e2e.stack import Stack, submit, wait_terminal
from tests.e2e.test_live_gates import batch_arrivals, put_settings, worker_samples
from tests.polling import poll_until
from tools.sim import SimConfig
from worker.preemption.channel import PATH

TOKEN = "e2e-channel-" + "c" * 32
SOCKET_TIMEOUT = 5.0
"""`worker.metrics_server.REQUEST_DEADLINE`."""
MAX_CONNECTIONS = 64
"""`worker.metrics_server.MAX_CONNECTIONS`."""
MAX_CONNECTIONS_PER_CLIENT = 16
"""`worker.metrics_server.MAX_CONNECTIONS_PER_CLIENT`."""
MAX_PROCESSES = 256
"""`activities.preemption.board.MAX_PROCESSES`."""


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def stack(tmp_path_factory: pytest.TempPathFactory, dev_server: Any) -> AsyncIterator[Stack]:
    s = Stack(
        tmp_path_factory.mktemp("channel"),
        dev_server.address,
        cap=2,
        sim=SimConfig(model_names=[], latency_ms=2000),
        preempt_token=TOKEN,
    )
    async with s.running():
        yield s


def channel(stack: Stack) -> str:
    return f"http://127.0.0.1:{stack.worker_metrics_ports[0]}/preempt/live"


def count(stack: Stack, **fields: Any) -> dict[str, Any]:
    """A live-count report on the stack's route, with `fields` changed (`policy` null: what
    every version of the worker accepts)."""
    return {"route": stack.route_id, "process": "p", "live": 0, "policy": None, **fields}


async def post(stack: Stack, body: Any) -> int:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with httpx.AsyncClient(timeout=10) as http:
        r = await http.post(channel(stack), content=content, headers=sign(TOKEN, PATH, content))
    return r.status_code


async def test_the_token_itself_or_a_replayed_report_is_refused(stack: Stack) -> None:
    """The worker takes signed reports only (the token never travels), each once."""
    body = json.dumps(count(stack, process="replayer", live=1)).encode()
    async with httpx.AsyncClient(timeout=10) as http:
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        assert (await http.post(channel(stack), content=body, headers=bearer)).status_code == 401
        signed = sign(TOKEN, PATH, body)
        assert (await http.post(channel(stack), content=body, headers=signed)).status_code == 204
        assert (await http.post(channel(stack), content=body, headers=signed)).status_code == 409


async def test_a_report_cannot_set_a_routes_policy(stack: Stack) -> None:
    """The route has seat-aware admission but preemption off; a report claiming a policy with
    no shared seat must not end its running lines."""
    async with httpx.AsyncClient(timeout=30) as http:
        await put_settings(
            stack, http, {"max_concurrent_lines": 2, "seat_aware": {"seats": 3, "keep_free": 0}}
        )
    client = stack.client()
    batch_id = await submit(stack, 4, prefix="policy")
    await poll_until(
        lambda: len(batch_arrivals(stack)),
        lambda n: n >= 2,
        timeout=30,
        what="two batch lines upstream",
    )
    forged = count(
        stack, process="intruder", live=50, policy={"batch_seats": 0, "max_preemptions": 100}
    )
    await post(stack, forged)  # accepted (an older api sends a policy) or refused: no matter
    batch = await wait_terminal(client, batch_id, within=120)
    assert batch.status == "completed", batch
    assert batch.model_extra is not None
    [entry] = batch.model_extra["backfill"]["routes"]
    assert entry["preempted_lines"] == 0, entry


@pytest.mark.parametrize(
    "field",
    [
        {"ttft_ms": 1e308},
        {"ttft_ms": float("nan")},
        {"live": 1_000_000},
        {"process": "p" * 201},
    ],
    ids=["huge-ttft", "nan-ttft", "huge-live", "long-process"],
)
async def test_every_field_is_bounded(stack: Stack, field: dict[str, Any]) -> None:
    body = count(stack, **{"live": 1, **field})
    assert await post(stack, json.dumps(body).encode()) == 400  # json.dumps writes NaN as NaN


async def test_only_configured_routes_are_accepted(stack: Stack) -> None:
    made_up = "made-up-route"
    assert await post(stack, count(stack, route=made_up, live=1)) == 400
    # Nothing of it on the worker: no board entry, so no metric series either.
    for name in ("gateway_batch_seats_held_back", "gateway_preempt_reporting_processes"):
        assert made_up not in await worker_samples(stack, name)


async def test_processes_that_stop_reporting_are_forgotten(stack: Stack) -> None:
    """Made-up process names cannot grow the worker's board: at most `MAX_PROCESSES` are kept
    per route, and one not heard from for the report TTL (5 s) is dropped."""
    reporting = "gateway_preempt_reporting_processes"
    bodies = [count(stack, process=f"made-up-{i}") for i in range(MAX_PROCESSES + 20)]

    async def every_process_reports() -> dict[str, float]:
        assert set(await asyncio.to_thread(pipelined, stack, bodies)) == {204}
        return await worker_samples(stack, reporting)

    # The cap shows once `MAX_PROCESSES` reports are fresh at once, so they are sent pipelined
    # (a round trip each took 10-80 ms on a loaded machine: more than the TTL for all), and a
    # round that still took longer than the TTL is followed by another that renews them all.
    kept = await poll_until(
        every_process_reports,
        lambda s: s.get(stack.route_id, 0) >= MAX_PROCESSES,
        timeout=60,
        what="the worker holding the reports",
        interval=0,
    )
    assert kept[stack.route_id] == MAX_PROCESSES
    # Silent for longer than the TTL, then one report: only that one process is held.
    quiet_until = time.monotonic() + 5.5  # the scenario: every made-up process falls silent
    while time.monotonic() < quiet_until:
        await asyncio.sleep(0.5)
    assert await post(stack, count(stack, process="last")) == 204
    await poll_until(
        lambda: worker_samples(stack, reporting),
        lambda s: s.get(stack.route_id) == 1,
        timeout=10,
        what="the silent processes forgotten",
    )


def pipelined(stack: Stack, bodies: list[dict[str, Any]], connections: int = 4) -> list[int]:
    """Each body POSTed to the channel, the requests of each connection sent back to back
    without waiting for the answers (HTTP/1.1 pipelining); the answers' statuses."""
    shares = [bodies[k::connections] for k in range(connections)]
    socks = [
        socket.create_connection(("127.0.0.1", stack.worker_metrics_ports[0]))
        for _ in range(connections)
    ]
    statuses: list[int] = []
    try:
        for sock, share in zip(socks, shares, strict=True):
            requests = b""
            for body in share:
                data = json.dumps(body).encode()
                signed = "".join(f"{k}: {v}\r\n" for k, v in sign(TOKEN, PATH, data).items())
                requests += (
                    b"POST /preempt/live HTTP/1.1\r\nHost: w\r\n"
                    + signed.encode()
                    + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(data)
                    + data
                )
            sock.sendall(requests)
        for sock, share in zip(socks, shares, strict=True):
            sock.settimeout(30)
            answers = b""
            while answers.count(b"\r\n\r\n") < len(share):  # 204s: a head and no body each
                chunk = sock.recv(65536)
                assert chunk, f"closed after {answers.count(b'HTTP/')} of {len(share)} answers"
                answers += chunk
            statuses += [int(head.split(b" ")[1]) for head in answers.split(b"\r\n\r\n")[:-1]]
    finally:
        for sock in socks:
            sock.close()
    return statuses


def raw(stack: Stack, request: bytes, timeout: float) -> bytes:
    """`request` sent on a fresh connection to the worker's HTTP server; what came back until
    the server closed it (b"": closed without an answer)."""
    with socket.create_connection(("127.0.0.1", stack.worker_metrics_ports[0])) as s:
        s.settimeout(timeout)
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
            if b"\r\n\r\n" in data and b"Connection: close" in data:
                break
        return data


async def test_a_malformed_content_length_is_answered_400(stack: Stack) -> None:
    for length in (b"abc", b"-5", b"1e3", b"99999999"):
        request = (
            b"POST /preempt/live HTTP/1.1\r\nHost: w\r\nContent-Length: " + length + b"\r\n\r\n{}"
        )
        answer = await asyncio.to_thread(raw, stack, request, 10)
        assert answer.split(b"\r\n", 1)[0].endswith(b" 400 Bad Request"), (length, answer)
    # The server still serves.
    async with httpx.AsyncClient(timeout=10) as http:
        assert (await http.get(channel(stack).replace("/preempt/live", "/metrics"))).is_success


async def test_a_silent_connection_is_closed(stack: Stack) -> None:
    """A client that connects and sends nothing (or stops mid-request) loses its connection
    after the server's socket timeout instead of holding a thread for ever."""
    started = time.monotonic()
    answer = await asyncio.to_thread(raw, stack, b"POST /preempt/live HTTP/1.1\r\n", 3 * 5.0)
    assert answer == b"" or b" 408 " in answer.split(b"\r\n", 1)[0], answer
    assert time.monotonic() - started < 3 * SOCKET_TIMEOUT


def connect_from(stack: Stack, source: str) -> socket.socket:
    """A connection to the worker's HTTP server from `source` (another loopback address: the
    server counts connections per client address)."""
    return socket.create_connection(
        ("127.0.0.1", stack.worker_metrics_ports[0]), source_address=(source, 0)
    )


def scrape_from(stack: Stack, source: str, timeout: float) -> bytes:
    """A `/metrics` request from `source`; what came back before the server closed it."""
    with connect_from(stack, source) as s:
        s.settimeout(timeout)
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: w\r\nConnection: close\r\n\r\n")
        data = b""
        try:
            while chunk := s.recv(65536):
                data += chunk
        except ConnectionResetError:
            pass
        return data


async def test_connections_beyond_the_limits_are_closed_at_once(stack: Stack) -> None:
    """One client address holds at most `MAX_CONNECTIONS_PER_CLIENT` connections (others are
    still served), and all together at most `MAX_CONNECTIONS`: one more is closed at once.
    The kernel queues the connections in order (the listen backlog holds them all) and the
    server accepts them in that order, so each idle one takes a slot for the request deadline.
    A server that kept one more waiting for a slot would answer it once an idle one times out:
    the bound below only ends a wait for a server that neither answers nor closes."""
    idle = [connect_from(stack, "127.0.0.2") for _ in range(MAX_CONNECTIONS_PER_CLIENT)]
    try:
        answer = await asyncio.to_thread(scrape_from, stack, "127.0.0.2", 3 * SOCKET_TIMEOUT)
        assert answer == b"", answer[:100]
        answer = await asyncio.to_thread(scrape_from, stack, "127.0.0.3", 3 * SOCKET_TIMEOUT)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:100]  # another client: served
        # Every slot taken (from many addresses): one more, from anywhere, is closed at once.
        idle += [
            connect_from(stack, f"127.0.0.{4 + k // MAX_CONNECTIONS_PER_CLIENT}")
            for k in range(MAX_CONNECTIONS)
        ]
        answer = await asyncio.to_thread(scrape_from, stack, "127.0.0.99", 3 * SOCKET_TIMEOUT)
        assert answer == b"", answer[:100]
    finally:
        for s in idle:
            s.close()
    # Their slots come back: scrapes are answered again.
    async with httpx.AsyncClient(timeout=10) as http:
        r = await poll_until(
            lambda: http.get(f"http://127.0.0.1:{stack.worker_metrics_ports[0]}/metrics"),
            lambda r: r.status_code == 200,
            timeout=3 * SOCKET_TIMEOUT,
            what="a scrape answered once the idle connections are gone",
            ignore=(httpx.HTTPError,),
        )
        assert r.status_code == 200
