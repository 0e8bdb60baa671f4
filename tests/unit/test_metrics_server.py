"""The worker's `/metrics`: prometheus-client's registry and the SDK's text on one port."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread

import pytest

from backfill.config import Settings
from worker.main import start_metrics
from worker.metrics_server import MetricsServer, sdk_metrics_bind

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
