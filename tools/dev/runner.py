"""`backfill dev` (what `make run` runs): the whole system on one machine.

Checks the routes first (`tools.dev.routes`: a route on this machine is served by the simulator
this command starts, or by a model server that must already answer), then starts the Temporal
dev server (SQLite under the data dir, so workflows survive restarts, with the search attributes
registered) or checks an existing Temporal (`--temporal-address`, `tools.dev.cluster`), then
the simulator (only when a route points at it), the worker and the api as child processes of
this one, each in its own process group. Prints the URLs once the api answers /healthz, and
writes them for `backfill doctor` (`backfill.operations.dev_stack`). On SIGINT/SIGTERM/SIGHUP stops
the children in reverse order, then the dev server (SIGKILL after a grace period; a second signal
skips the grace period) and exits 0. If a child exits on its own, stops the rest and exits 1.
However this process dies, SIGKILL and the OOM killer included, the kernel kills its children
(`Child(die_with_parent=True)`): they are started from this main thread.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Protocol

from backfill.operations import dev_stack
from backfill.operations.doctor import Finding
from backfill.platform.config import Settings
from tools.dev import cluster, routes
from tools.dev.devserver import DEFAULT_PORT, DEFAULT_UI_PORT, DevServer, DevServerError
from tools.dev.procs import Child, backfill_argv, free_port, port_in_use

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
LOOPBACK = routes.LOOPBACK
HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""Signals that stop the stack in order (SIGHUP: the terminal closed)."""


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


def existing_temporal(settings: Settings, flag: str | None) -> str | None:
    """The address of a Temporal to use instead of the embedded dev server: the flag's, else
    TEMPORAL_ADDRESS (the environment's or the config's); None runs the embedded one."""
    if flag:
        return flag
    if "temporal_address" in settings.model_fields_set:
        return settings.temporal_address
    return None


def busy_ports(ports: dict[str, tuple[str, int]]) -> str | None:
    """What to say when some of `ports` (flag → (what, port)) are taken, or None: each taken
    one, and the command line that moves them to ports free a moment ago."""
    taken = {flag: wp for flag, wp in ports.items() if wp[1] and port_in_use(wp[1], LOOPBACK)}
    if not taken:
        return None
    listed = ", ".join(f"{what} {LOOPBACK}:{port}" for what, port in taken.values())
    moves = " ".join(f"{flag} {free_port(LOOPBACK)}" for flag in taken)
    return (
        f"port(s) already in use: {listed} (another `make run`?). Stop it, or move this "
        f"stack: run `backfill dev` (what `make run` runs) with {moves} (`backfill doctor` "
        "follows a moved stack)"
    )


def _refuse(findings: list[Finding]) -> int:
    lines = [line for f in findings for line in f.lines()]
    print("backfill dev: refusing to start:\n" + "\n".join(lines), file=sys.stderr)
    return 2


def run(
    settings: Settings,
    *,
    temporal_port: int = DEFAULT_PORT,
    ui_port: int = DEFAULT_UI_PORT,
    sim_port: int = 8100,
    api_port: int | None = None,
    worker_metrics_port: int | None = None,
    temporal_address: str | None = None,
    ready_timeout: float = READY_TIMEOUT,
) -> int:
    """Run everything until a signal (exit 0) or a child's unexpected exit (exit 1); exit 1
    when a port is taken, 2 when a local route's model server or the existing Temporal is not
    usable, in both cases without starting anything."""
    api_port = settings.api_port if api_port is None else api_port
    if worker_metrics_port is None:
        worker_metrics_port = settings.worker_metrics_port
    api_host = settings.api_host
    local_host = LOOPBACK if api_host in ("", "0.0.0.0", "::") else api_host
    api_base = f"http://{local_host}:{api_port}"
    existing = existing_temporal(settings, temporal_address)

    ports = {"--api-port": ("api", api_port)}
    ports["--worker-metrics-port"] = ("worker metrics", worker_metrics_port)
    if existing is None:
        ports["--temporal-port"] = ("Temporal", temporal_port)
        ports["--ui-port"] = ("Temporal UI", ui_port)
    taken = busy_ports(ports)
    if taken is not None:
        print(f"backfill dev: {taken}", file=sys.stderr)
        return 1

    plan = asyncio.run(routes.plan(settings, sim_port))
    if plan.refused:
        return _refuse(plan.refused)
    if existing is not None:
        settings = settings.model_copy(update={"temporal_address": existing})
        prepared = asyncio.run(cluster.prepare(settings))
        if prepared.refused:
            return _refuse(prepared.refused)
        for registered in prepared.registered:
            log.info(
                "registered search attribute %s on namespace %s",
                registered,
                settings.temporal_namespace,
            )
        for warning in prepared.warnings:
            log.warning("%s", warning)
    for found in plan.findings:
        log.info("%s: %s (a model server already running)", found.check, found.said)
    if not plan.sim_models:
        log.info("no route points at %s:%s: the simulator is not started", LOOPBACK, sim_port)

    data_dir = Path(settings.data_dir)
    data_dir.mkdir(mode=0o750, parents=True, exist_ok=True)

    signals = _Signals()
    previous = {sig: signal.signal(sig, signals.handler) for sig in HANDLED}
    server: DevServer | None = None
    if existing is None:
        server = DevServer(
            data_dir,
            port=temporal_port,
            ui_port=ui_port,
            ip=LOOPBACK,
            db_filename="temporal.db",
            namespace=settings.temporal_namespace,
            dynamic_config=EMBEDDED_DYNAMIC_CONFIG,
            die_with_parent=True,
        )
    children: list[Child] = []
    written = False
    try:
        temporal_env: dict[str, str | None]
        if server is None:
            address = settings.temporal_address
            temporal_env = {"TEMPORAL_ADDRESS": address}  # TLS and API key as configured
        else:
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
            address = server.address
            temporal_env = {
                "TEMPORAL_ADDRESS": address,
                # The local dev server speaks plain gRPC without auth.
                "TEMPORAL_TLS": None,
                "TEMPORAL_TLS_CERT": None,
                "TEMPORAL_TLS_KEY": None,
                "TEMPORAL_API_KEY": None,
            }

        env: dict[str, str | None] = {
            **temporal_env,
            "TEMPORAL_NAMESPACE": settings.temporal_namespace,
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
        processes: list[tuple[str, list[str]]] = []
        if plan.sim_models:
            sim_args = ["--host", LOOPBACK, "--port", str(sim_port)]
            sim_args += [x for model in plan.sim_models for x in ("--model", model)]
            processes.append(("simulator", backfill_argv("sim", *sim_args)))
        processes += [("worker", backfill_argv("worker")), ("api", backfill_argv("api"))]
        for name, argv in processes:
            child = Child(name, die_with_parent=True)
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

        sim_url = f"http://{LOOPBACK}:{sim_port}" if plan.sim_models else None
        dev_stack.write(
            data_dir,
            dev_stack.DevStack(
                pid=os.getpid(),
                pid_started=dev_stack.process_started(os.getpid()),
                temporal_address=address,
                temporal_namespace=settings.temporal_namespace,
                task_queue=settings.task_queue,
                temporal_started=server is not None,
                api_url=api_base,
                simulator_url=sim_url,
                worker_metrics_port=worker_metrics_port,
                preempt_token_set=True,
            ),
        )
        written = True
        print(
            _banner(settings, server, address, api_base, sim_url, plan, worker_metrics_port),
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
        if written:
            dev_stack.remove(data_dir, os.getpid())
        for child in reversed(children):
            if child.started:
                _stop(child.name, child, signals)
        if server is not None and server.pid is not None:
            _stop("Temporal dev server", server, signals)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _banner(
    settings: Settings,
    server: DevServer | None,
    address: str,
    api_base: str,
    sim_url: str | None,
    plan: routes.Plan,
    worker_metrics_port: int,
) -> str:
    data_dir = Path(settings.data_dir)
    namespace = settings.temporal_namespace
    lines = [
        "",
        "backfill is running:",
        f"  API            {api_base}/v1",
        f"  API key        {DEV_API_KEY}",
        f"  console        {api_base}/console (sign in with the key)",
    ]
    if server is not None:
        lines += [
            f"  Temporal UI    {server.ui_url}",
            f"  Temporal       {address} (namespace {namespace})",
        ]
    else:
        lines.append(
            f"  Temporal       {address} (namespace {namespace}; not started by backfill dev)"
        )
    if sim_url is not None:
        lines.append(f"  simulator      {sim_url} (model(s) {', '.join(plan.sim_models)})")
    lines += [f"  model server   {f.said}" for f in plan.findings]
    lines += [
        f"  metrics        {api_base}/metrics (worker: http://{LOOPBACK}:{worker_metrics_port}/metrics)",
    ]
    where = f"{data_dir}/" + (f" (Temporal log: {server.log_path})" if server is not None else "")
    lines += [f"  data           {where}", "Press Ctrl-C to stop.", ""]
    return "\n".join(lines)


def _first_dead(children: list[Child], server: DevServer | None) -> tuple[str, int] | None:
    for child in children:
        rc = child.returncode
        if rc is not None:
            return child.name, rc
    if server is None:
        return None
    rc = server.returncode
    if rc is not None:
        return "the Temporal dev server", rc
    return None
