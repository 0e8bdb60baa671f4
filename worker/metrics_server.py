"""The worker's `/metrics`: the gateway's own metrics and the Temporal SDK's, on one port.

The SDK's Rust core serves its metrics (`temporal_*`: task slots, schedule-to-start latency,
activity failures, ...) on an HTTP endpoint of its own (`PrometheusConfig`). The worker binds that
one to a free loopback port and serves, on `BACKFILL_WORKER_METRICS_HOST:PORT`, prometheus-client's
registry followed by the SDK's text, so one scrape job (`backfill-worker`) sees both. Both are the
Prometheus text format 0.0.4 and their names do not overlap (`gateway_*` vs `temporal_*`).
"""

from __future__ import annotations

import logging
import socket
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from worker.preempt_channel import MAX_BODY, PATH, PreemptChannel

log = logging.getLogger(__name__)

SDK_FETCH_TIMEOUT = 2.0
"""Seconds to read the SDK's own endpoint on loopback while answering a scrape."""


def sdk_metrics_bind() -> str:
    """A loopback address for the SDK's endpoint (a port free a moment ago)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


class MetricsServer:
    """`GET /metrics` on (host, port) in a thread of its own (scrapes never wait for the loop),
    and, with preemptive yield's channel, `POST /preempt/live` (`worker.preempt_channel`)."""

    def __init__(
        self,
        host: str,
        port: int,
        sdk_bind: str | None,
        preempt: PreemptChannel | None = None,
    ) -> None:
        self.sdk_url = f"http://{sdk_bind}/metrics" if sdk_bind else None
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # api processes keep their connection for live counts

            def do_POST(self) -> None:  # noqa: N802  # http.server's name
                length = int(self.headers.get("Content-Length") or 0)
                if preempt is None or self.path != PATH or not 0 < length <= MAX_BODY:
                    self.send_error(404 if preempt is None or self.path != PATH else 400)
                    return
                status = preempt.handle(self.headers.get("Authorization"), self.rfile.read(length))
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

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
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
        self.server.shutdown()
        self.server.server_close()
