"""The worker's `/metrics`: the gateway's own metrics and the Temporal SDK's, on one port.

The SDK's Rust core serves its metrics (`temporal_*`: task slots, schedule-to-start latency,
activity failures, ...) on an HTTP endpoint of its own (`PrometheusConfig`). The worker binds that
one to a free loopback port and serves, on `BACKFILL_WORKER_METRICS_HOST:PORT`, prometheus-client's
registry followed by the SDK's text, so one scrape job (`backfill-worker`) sees both. Both are the
Prometheus text format 0.0.4 and their names do not overlap (`gateway_*` vs `temporal_*`).
"""

from __future__ import annotations

import io
import logging
import socket
import threading
import time
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from backfill.preemption.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER
from worker.preemption.channel import MAX_BODY, PreemptChannel

log = logging.getLogger(__name__)

SDK_FETCH_TIMEOUT = 2.0
"""Seconds to read the SDK's own endpoint on loopback while answering a scrape."""
REQUEST_DEADLINE = 5.0
"""Seconds a connection has for each whole request, head and body, counted from when the server
starts waiting for it (the connection accepted, or the previous answer sent); past it the
connection is closed. A deadline per request, not per read: a client trickling a byte at a time
keeps a thread no longer than one that sends nothing."""
SOCKET_TIMEOUT = 5.0
"""Seconds each answer may take to be sent (a client that does not read it is cut)."""
MAX_CONNECTIONS = 64
"""Connections served at once (a thread each); one more is closed at once. Scrapes, the api
processes' live counts and the other workers' lines need a few each: the limit keeps a flood of
connections from taking the threads and memory of the process that runs the batch lines."""
MAX_CONNECTIONS_PER_CLIENT = 16
"""Connections served at once from one address; one more from it is closed at once, so one
client cannot take the slots every other one needs (an api process or a scrape holds one,
another worker one per route it reports on at once)."""
BACKLOG = 128
"""Connections the kernel queues, in order, until the server's thread accepts them (then each is
served, or closed at once beyond `MAX_CONNECTIONS`). socketserver's default is 5: while the
worker's event loop holds the interpreter, a burst of more (api processes and other workers
reconnecting, scrapes) had handshakes dropped and their connections stalled for seconds of TCP
retransmission, past the channel's 1 s send timeout."""


def sdk_metrics_bind() -> str:
    """A loopback address for the SDK's endpoint (a port free a moment ago)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


class BoundedHTTPServer(ThreadingHTTPServer):
    """A `ThreadingHTTPServer` that serves at most `limit` connections at once, and at most
    `per_client` from one address, and closes one more at once (never kept waiting for a slot:
    that would hold the client waiting)."""

    daemon_threads = True
    request_queue_size = BACKLOG

    def __init__(
        self,
        address: tuple[str, int],
        handler: type,
        limit: int,
        per_client: int = MAX_CONNECTIONS_PER_CLIENT,
    ) -> None:
        super().__init__(address, handler)
        self._slots = threading.BoundedSemaphore(limit)
        self._per_client = per_client
        self._clients: dict[str, int] = {}
        """Connections being served, by client address (none at 0: the dict holds those
        connected now only)."""
        self._lock = threading.Lock()

    def _take(self, client: str) -> bool:
        with self._lock:
            if self._clients.get(client, 0) >= self._per_client:
                return False
            if not self._slots.acquire(blocking=False):
                return False
            self._clients[client] = self._clients.get(client, 0) + 1
            return True

    def _give_back(self, client: str) -> None:
        with self._lock:
            left = self._clients.pop(client, 1) - 1
            if left > 0:
                self._clients[client] = left
            self._slots.release()

    def process_request(self, request: Any, client_address: Any) -> None:
        client = str(client_address[0])
        if not self._take(client):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._give_back(client)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._give_back(str(client_address[0]))


class DeadlineReader(io.RawIOBase):
    """A connection's bytes, each read bounded by what is left of the current request's
    deadline (`deadline()`, monotonic seconds); past it, `TimeoutError`."""

    def __init__(self, sock: socket.socket, deadline: Callable[[], float]) -> None:
        self._sock = sock
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self._deadline() - time.monotonic()
        if left <= 0:
            raise TimeoutError("request deadline passed")
        self._sock.settimeout(left)
        return self._sock.recv_into(buffer)


def content_length(value: str | None) -> int | None:
    """A request's `Content-Length` as a byte count (0 when absent); None when it is not one
    (not digits, several values)."""
    if value is None:
        return 0
    value = value.strip()
    return int(value) if value.isascii() and value.isdigit() else None


class MetricsServer:
    """`GET /metrics` on (host, port) in a thread of its own (scrapes never wait for the loop), and,
    with preemptive yield's channel, `POST /preempt/live` and `/preempt/lines`
    (`worker.preemption.channel`). At most `MAX_CONNECTIONS` at once and
    `MAX_CONNECTIONS_PER_CLIENT` from one address; a connection whose request is not complete
    `REQUEST_DEADLINE` s after the server began waiting for it is closed; a request whose length
    is not a byte count within its path's `MAX_BODY` is answered 400."""

    def __init__(
        self,
        host: str,
        port: int,
        sdk_bind: str | None,
        preempt: PreemptChannel | None = None,
        request_deadline: float = REQUEST_DEADLINE,
    ) -> None:
        self.sdk_url = f"http://{sdk_bind}/metrics" if sdk_bind else None
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # api processes keep their connection for live counts
            timeout = SOCKET_TIMEOUT
            deadline = 0.0
            """When the request being read must be complete (monotonic seconds)."""

            def setup(self) -> None:
                super().setup()
                self.rfile.close()  # the socket's own file: every read goes through the deadline
                self.rfile = io.BufferedReader(
                    DeadlineReader(self.connection, lambda: self.deadline)
                )

            def handle_one_request(self) -> None:
                self.deadline = time.monotonic() + request_deadline
                super().handle_one_request()

            def send_response(self, code: int, message: str | None = None) -> None:
                self.connection.settimeout(SOCKET_TIMEOUT)  # the answer: its own bound
                super().send_response(code, message)

            def do_POST(self) -> None:  # noqa: N802  # http.server's name
                if preempt is None or self.path not in MAX_BODY:
                    self.send_error(404)
                    return
                length = content_length(self.headers.get("Content-Length"))
                if (
                    length is None
                    or not 0 < length <= MAX_BODY[self.path]
                    or "Transfer-Encoding" in self.headers
                ):
                    self.close_connection = True  # the body's end is unknown: nothing follows
                    self.send_error(400)
                    return
                try:
                    body = self.rfile.read(length)
                except TimeoutError:
                    self.close_connection = True  # past the request's deadline: cut
                    return
                if len(body) < length:  # the client closed mid-body
                    self.close_connection = True
                    return
                status = preempt.handle(
                    self.headers.get(TIMESTAMP_HEADER),
                    self.headers.get(SIGNATURE_HEADER),
                    body,
                    self.path,
                )
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_GET(self) -> None:  # noqa: N802  # http.server's name
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                body = outer.render()
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE_LATEST)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # a scrape every 15 s is not worth a log line

        self.server = BoundedHTTPServer((host, port), Handler, MAX_CONNECTIONS)
        self.thread = threading.Thread(
            target=self.server.serve_forever, name="metrics", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def render(self) -> bytes:
        ours = generate_latest()
        if self.sdk_url is None:
            return ours
        try:
            with urllib.request.urlopen(self.sdk_url, timeout=SDK_FETCH_TIMEOUT) as resp:
                sdk = resp.read()
        except OSError as err:
            log.warning("Temporal SDK metrics unavailable: %s", err)
            return ours
        return ours + sdk

    def start(self) -> MetricsServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        if self.thread.is_alive():  # shutdown() waits for a serve_forever that never began
            self.server.shutdown()
        self.server.server_close()
