"""`backfill dev` (what `make run` runs): the whole system on one machine.

Starts the Temporal dev server (SQLite under the data dir, so workflows survive restarts, with
the search attributes registered), then the simulator, the worker and the api as child
processes of this one, each in its own process group. Prints the URLs once the api answers
/healthz. On SIGINT/SIGTERM stops the children in reverse order, then the dev server (SIGKILL
after a grace period; a second signal skips the grace period) and exits 0. If a child exits on
its own, stops the rest and exits 1.
"""

from __future__ import annotations

import logging
import secrets
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Protocol
from urllib.parse import urlsplit

from backfill.config import Settings
from tools.dev.devserver import DevServer, DevServerError
from tools.dev.procs import Child, backfill_argv, port_in_use

EMBEDDED_DYNAMIC_CONFIG = {"history.maximumBufferedEventsBatch": 1000}
"""The embedded dev server's settings beyond its defaults. At the default (100 buffered events) a
route of 256 lines of ~2 s has the server fail a batch's workflow task that runs a few hundred
milliseconds (FORCE_CLOSE_COMMAND), and the worker redo it from the full history
(docs/performance.md, "Session 4"); the operator guide asks the same of a production cluster."""

log = logging.getLogger("tools.dev")

DEV_API_KEY = "sk-backfill-dev"
"""The key whose hash backfill.toml lists (workspace `default`, role platform_admin)."""

READY_TIMEOUT = 60.0
STOP_TIMEOUT = 10.0
LOOPBACK = "127.0.0.1"


class _Stoppable(Protocol):
    def send_signal(self, sig: int) -> None: ...

    def wait(self, timeout: float | None = None) -> int | None: ...

    def kill(self) -> int | None: ...

    def stop(self, timeout: float = 10.0) -> int | None: ...


@dataclass
class _Signals:
    """SIGINT/SIGTERM set `stop`; a second one while stopping sets `force`."""

    stop: threading.Event = field(default_factory=threading.Event)
    force: threading.Event = field(default_factory=threading.Event)
    received: list[int] = field(default_factory=list)

    def handler(self, signum: int, frame: FrameType | None) -> None:
        self.received.append(signum)
        if self.stop.is_set():
            self.force.set()
        self.stop.set()


def _stop(name: str, proc: _Stoppable, signals: _Signals, timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM, wait up to timeout (less if a second signal arrives), then SIGKILL."""
    proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while proc.wait(0.1) is None:
        if signals.force.is_set() or time.monotonic() >= deadline:
            log.warning("%s did not stop in time; killing it", name)
            proc.kill()
            break
    status = proc.stop(0)  # reaps, sweeps the process group, closes the log
    log.info("%s stopped (status %s)", name, status)


def _healthz_ok(url: str) -> bool:
    import httpx

    try:
        resp = httpx.get(url, timeout=3.0, trust_env=False)
        # 200 "degraded" means the api serves but is not connected to Temporal yet.
        return resp.status_code == 200 and resp.json().get("status") == "ok"
    except (httpx.HTTPError, ValueError):
        return False


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def _loopback_port(base_url: str) -> int | None:
    """The port of a loopback base URL, None for any other host."""
    parts = urlsplit(base_url)
    if parts.hostname not in LOOPBACK_HOSTS:
        return None
    return parts.port or (443 if parts.scheme == "https" else 80)


def _sim_model(settings: Settings, sim_port: int) -> str:
    """The model id whose route points at the local simulator (the sim serves that name)."""
    for model in settings.models:
        for route in model.routes:
            if _loopback_port(route.base_url) == sim_port:
                return model.id
    return "demo"


def misrouted(settings: Settings, sim_port: int) -> str | None:
    """Why `backfill dev` must not start with these routes, or None: routes on this machine
    exist but none points at the simulator it starts (a copied config still pointing at another
    stack's simulator would send this stack's lines there)."""
    local = [
        (route.id, route.base_url, port)
        for model in settings.models
        for route in model.routes
        if (port := _loopback_port(route.base_url)) is not None
    ]
    if not local or any(port == sim_port for _, _, port in local):
        return None
    route_id, base_url, port = local[0]
    return (
        f"route {route_id} points at {base_url}, but this stack's simulator listens on "
        f"{LOOPBACK}:{sim_port}: its lines would go to whatever listens on port {port} (another "
        f'stack\'s simulator?). Set base_url = "http://{LOOPBACK}:{sim_port}/v1" for it in the '
        f"file BACKFILL_CONFIG names, or run with --sim-port {port}."
    )


def run(
    settings: Settings,
    *,
    temporal_port: int = 7233,
    ui_port: int = 8233,
    sim_port: int = 8100,
    api_port: int | None = None,
    worker_metrics_port: int | None = None,
    ready_timeout: float = READY_TIMEOUT,
) -> int:
    """Run everything until a signal (exit 0) or a child's unexpected exit (exit 1); exit 2
    without starting anything when the routes point at another simulator (`misrouted`)."""
    wrong = misrouted(settings, sim_port)
    if wrong is not None:
        print(f"backfill dev: refusing to start: {wrong}", file=sys.stderr)
        return 2
    api_port = settings.api_port if api_port is None else api_port
    if worker_metrics_port is None:
        worker_metrics_port = settings.worker_metrics_port
    api_host = settings.api_host
    local_host = LOOPBACK if api_host in ("", "0.0.0.0", "::") else api_host
    api_base = f"http://{local_host}:{api_port}"

    busy = [
        f"{what} {LOOPBACK}:{port}"
        for what, port in (
            ("Temporal", temporal_port),
            ("Temporal UI", ui_port),
            ("simulator", sim_port),
            ("api", api_port),
            ("worker metrics", worker_metrics_port),
        )
        if port and port_in_use(port, LOOPBACK)
    ]
    if busy:
        print(
            f"backfill dev: port(s) already in use: {', '.join(busy)} "
            "(is another `make run` running?)",
            file=sys.stderr,
        )
        return 1

    data_dir = Path(settings.data_dir)
    data_dir.mkdir(mode=0o750, parents=True, exist_ok=True)

    signals = _Signals()
    previous = {sig: signal.signal(sig, signals.handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    server = DevServer(
        data_dir,
        port=temporal_port,
        ui_port=ui_port,
        ip=LOOPBACK,
        db_filename="temporal.db",
        namespace=settings.temporal_namespace,
        dynamic_config=EMBEDDED_DYNAMIC_CONFIG,
    )
    children: list[Child] = []
    try:
        log.info(
            "starting the Temporal dev server (db %s, log %s)", server.db_path, server.log_path
        )
        server.start()
        try:
            server.wait_ready(ready_timeout, abort=signals.stop.is_set)
        except DevServerError as e:
            if signals.stop.is_set():
                return 0
            log.error("%s", e)
            return 1
        log.info("Temporal dev server ready at %s", server.address)

        env: dict[str, str | None] = {
            "TEMPORAL_ADDRESS": server.address,
            "TEMPORAL_NAMESPACE": settings.temporal_namespace,
            # The local dev server speaks plain gRPC without auth.
            "TEMPORAL_TLS": None,
            "TEMPORAL_TLS_CERT": None,
            "TEMPORAL_TLS_KEY": None,
            "TEMPORAL_API_KEY": None,
            "BACKFILL_API_HOST": api_host,
            "BACKFILL_API_PORT": str(api_port),
            # A development stack: the api may serve the repository's public dev keys.
            "BACKFILL_DEV_STACK": "1",
            "BACKFILL_WORKER_METRICS_PORT": str(worker_metrics_port),
            # Preemptive yield's channel: a fresh token each run, the worker's /metrics server
            # on loopback (the api finds it on the task queue: decision 0034).
            "BACKFILL_PREEMPT_TOKEN": secrets.token_urlsafe(32),
            "BACKFILL_WORKER_METRICS_HOST": LOOPBACK,
            "PYTHONUNBUFFERED": "1",
        }
        sim_args = ["--host", LOOPBACK, "--port", str(sim_port)]
        sim_args += ["--model", _sim_model(settings, sim_port)]
        for name, argv in (
            ("simulator", backfill_argv("sim", *sim_args)),
            ("worker", backfill_argv("worker")),
            ("api", backfill_argv("api")),
        ):
            child = Child(name)
            child.start(argv, env=env)
            children.append(child)
            log.info("started %s (pid %s)", name, child.pid)

        deadline = time.monotonic() + ready_timeout
        while True:
            if signals.stop.is_set():
                return 0
            dead = _first_dead(children, server)
            if dead is not None:
                log.error("%s exited with status %s during startup; stopping", *dead)
                return 1
            if _healthz_ok(f"{api_base}/healthz"):
                break
            if time.monotonic() >= deadline:
                log.error("the api did not answer %s/healthz within %.0fs", api_base, ready_timeout)
                return 1
            signals.stop.wait(0.25)

        print(
            "\nbackfill is running:\n"
            f"  API            {api_base}/v1\n"
            f"  API key        {DEV_API_KEY}\n"
            f"  console        {api_base}/console (sign in with the key)\n"
            f"  Temporal UI    http://{LOOPBACK}:{ui_port}\n"
            f"  Temporal       {server.address} (namespace {settings.temporal_namespace})\n"
            f"  simulator      http://{LOOPBACK}:{sim_port}\n"
            f"  metrics        {api_base}/metrics (worker: http://{LOOPBACK}:{worker_metrics_port}/metrics)\n"
            f"  data           {data_dir}/ (Temporal log: {server.log_path})\n"
            "Press Ctrl-C to stop.\n",
            flush=True,
        )

        while not signals.stop.wait(0.5):
            dead = _first_dead(children, server)
            if dead is not None:
                log.error("%s exited unexpectedly with status %s; stopping everything", *dead)
                return 1
        return 0
    finally:
        if signals.received:
            log.info("received %s; shutting down", signal.Signals(signals.received[0]).name)
        for child in reversed(children):
            if child.started:
                _stop(child.name, child, signals)
        if server.pid is not None:
            _stop("Temporal dev server", server, signals)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _first_dead(children: list[Child], server: DevServer) -> tuple[str, int] | None:
    for child in children:
        rc = child.returncode
        if rc is not None:
            return child.name, rc
    rc = server.returncode
    if rc is not None:
        return "the Temporal dev server", rc
    return None
