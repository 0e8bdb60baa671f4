"""The worker's `/metrics`: prometheus-client's registry and the SDK's text on one port."""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread

import pytest

from backfill.platform.config import Settings
from worker.main import start_metrics
from worker.metrics_server import (
    MAX_CONNECTIONS,
    MAX_CONNECTIONS_PER_CLIENT,
    REQUEST_DEADLINE,
    MetricsServer,
    sdk_metrics_bind,
)

SDK_TEXT = b"# TYPE temporal_worker_start counter\ntemporal_worker_start 1\n"


class FakeSdk(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        self.send_response(200)
        self.end_headers()
        self.wfile.write(SDK_TEXT)

    def log_message(self, format: str, *args: object) -> None:
        pass


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, b""


def test_one_scrape_shows_ours_and_the_sdks() -> None:
    sdk = ThreadingHTTPServer(("127.0.0.1", 0), FakeSdk)
    Thread(target=sdk.serve_forever, daemon=True).start()
    server = MetricsServer("127.0.0.1", 0, f"127.0.0.1:{sdk.server_address[1]}").start()
    try:
        status, body = get(f"http://127.0.0.1:{server.port}/metrics")
        assert status == 200
        assert b"gateway_batch_stall_seconds" in body  # ours (declared, maybe without series)
        assert body.endswith(SDK_TEXT)
        assert get(f"http://127.0.0.1:{server.port}/other")[0] == 404
    finally:
        server.stop()
        sdk.shutdown()
        sdk.server_close()


def test_an_unreachable_sdk_endpoint_still_serves_ours() -> None:
    server = MetricsServer("127.0.0.1", 0, sdk_metrics_bind()).start()  # nothing listens there
    try:
        status, body = get(f"http://127.0.0.1:{server.port}/metrics")
        assert status == 200 and b"gateway_batch_line_outcomes_total" in body
        assert b"temporal_" not in body
    finally:
        server.stop()


def test_a_taken_port_leaves_the_worker_without_metrics(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        settings = Settings(worker_metrics_host="127.0.0.1", worker_metrics_port=port)
        assert start_metrics(settings, sdk_metrics_bind()) is None
    assert "cannot listen" in caplog.text


def test_a_burst_of_connections_waits_in_order_and_the_one_beyond_the_limit_is_closed() -> None:
    """While the server's thread is not accepting (the worker's event loop holds the
    interpreter), more connections than the limit still connect: the kernel queues them in
    order. Once accepted, the first `MAX_CONNECTIONS` are served and the one after is closed
    without an answer. (With socketserver's backlog of 5, the 7th connection's handshake was
    dropped and it stalled in TCP retransmission.)"""
    server = MetricsServer("127.0.0.1", 0, None)  # listening, not yet accepting
    scrape = b"GET /metrics HTTP/1.1\r\nHost: w\r\n\r\n"
    conns: list[socket.socket] = []
    try:
        for k in range(MAX_CONNECTIONS + 1):
            # Connecting is the kernel's work alone: a queued connection is connected at once,
            # one whose handshake is dropped is not connected within the bound. From several
            # loopback addresses: one client address holds at most its own share.
            source = (f"127.0.1.{1 + k // MAX_CONNECTIONS_PER_CLIENT}", 0)
            conns.append(
                socket.create_connection(
                    ("127.0.0.1", server.port), timeout=3, source_address=source
                )
            )
        for conn in conns:
            conn.sendall(scrape)
        server.start()
        answers = [head(conn) for conn in conns]
        assert all(a.startswith(b"HTTP/1.1 200 ") for a in answers[:-1]), answers[:-1]
        assert answers[-1] == b""
    finally:
        for conn in conns:
            conn.close()
        server.stop()


def head(conn: socket.socket) -> bytes:
    """An answer's status line and headers (the connection stays open: its slot stays held),
    or b"" when the server closed the connection without one."""
    conn.settimeout(10)
    data = b""
    try:
        while b"\r\n\r\n" not in data and (chunk := conn.recv(65536)):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def test_one_client_holds_at_most_its_share_of_the_connections() -> None:
    server = MetricsServer("127.0.0.1", 0, None).start()
    scrape = b"GET /metrics HTTP/1.1\r\nHost: w\r\n\r\n"

    def connect(source: str) -> socket.socket:
        return socket.create_connection(
            ("127.0.0.1", server.port), timeout=3, source_address=(source, 0)
        )

    greedy = [connect("127.0.2.1") for _ in range(MAX_CONNECTIONS_PER_CLIENT)]
    try:
        for conn in greedy:  # each served (so each holds its slot, waiting for the next request)
            conn.sendall(scrape)
            assert head(conn).startswith(b"HTTP/1.1 200 ")
        with connect("127.0.2.1") as one_more:
            one_more.sendall(scrape)
            assert head(one_more) == b""  # closed at once
        with connect("127.0.2.2") as another:
            another.sendall(scrape)
            assert head(another).startswith(b"HTTP/1.1 200 ")  # another client: served
    finally:
        for conn in greedy:
            conn.close()
        server.stop()


def test_a_trickling_client_is_cut_at_the_request_deadline_while_another_is_served() -> None:
    """A slow-loris client sends its request a byte at a time, each well inside any read
    timeout: the server closes it once the whole request has taken `REQUEST_DEADLINE`, and
    answers another client meanwhile. (A timeout per read never cut it.)"""
    server = MetricsServer("127.0.0.1", 0, None).start()
    request = b"GET /metrics HTTP/1.1\r\nHost: w\r\nX-Pad: " + b"x" * 4000 + b"\r\n\r\n"
    outcome: dict[str, float] = {}

    def trickle() -> None:
        with socket.create_connection(("127.0.0.1", server.port), timeout=3) as conn:
            started = time.monotonic()
            try:
                for i in range(len(request)):
                    conn.sendall(request[i : i + 1])
                    time.sleep(0.1)
                    if time.monotonic() - started > 6 * REQUEST_DEADLINE:
                        return  # never cut
            except (BrokenPipeError, ConnectionResetError):
                outcome["cut"] = time.monotonic() - started
                return
            outcome["sent"] = time.monotonic() - started

    slow = threading.Thread(target=trickle)
    slow.start()
    try:
        time.sleep(0.5)  # the slow request under way
        status, _ = get(f"http://127.0.0.1:{server.port}/metrics")
        assert status == 200  # served while the trickle goes on
        slow.join(timeout=8 * REQUEST_DEADLINE)
    finally:
        server.stop()
    assert "cut" in outcome, outcome
    assert REQUEST_DEADLINE - 0.5 <= outcome["cut"] <= 3 * REQUEST_DEADLINE, outcome
