"""tools.dev.devserver, tools.dev.procs and the small CLI commands, on the real binaries."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.client import Client, WorkflowExecutionStatus

from backfill.batches.search_attributes import ALL
from backfill.platform.config import hash_key
from tools.cli import main
from tools.dev.devserver import (
    DevServer,
    DevServerError,
    connect_client,
    free_port,
    temporal_cli_path,
    test_server_path,
)
from tools.dev.procs import Child, pid_alive, port_in_use

REPO = Path(__file__).resolve().parents[2]


def wait_for_text(path: Path, text: str, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in (content := path.read_text()):
            return content
        time.sleep(0.05)
    raise AssertionError(f"{text!r} not in {path} after {timeout}s")


# --- binaries ------------------------------------------------------------------------------------


def test_binaries_are_found_locally() -> None:
    venv_bin = Path(sys.executable).parent
    for path in (temporal_cli_path(), test_server_path()):
        assert path.is_file() and os.access(path, os.X_OK)
        assert path.parent == venv_bin
    out = subprocess.run(
        [str(temporal_cli_path()), "--version"], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0 and "temporal version" in out.stdout


def test_argv() -> None:
    server = DevServer(
        Path("/tmp/x"),
        port=1234,
        ui_port=None,
        dynamic_config={"limit.historyCount.suggestContinueAsNew": 50},
    )
    argv = server.argv()
    assert argv[1:3] == ["server", "start-dev"]
    assert "--headless" in argv and "--ui-port" not in argv
    assert argv[argv.index("--port") + 1] == "1234"
    assert argv[argv.index("--ip") + 1] == "127.0.0.1"
    assert argv[argv.index("--db-filename") + 1] == "/tmp/x/temporal.db"
    pairs = [argv[i + 1] for i, a in enumerate(argv) if a == "--search-attribute"]
    assert pairs == [f"{name}={type_}" for name, type_ in ALL.items()]
    assert argv[argv.index("--dynamic-config-value") + 1] == (
        "limit.historyCount.suggestContinueAsNew=50"
    )
    with_ui = DevServer(Path("/tmp/x"), port=1, ui_port=2, db_filename=None).argv()
    assert with_ui[with_ui.index("--ui-port") + 1] == "2"
    assert "--headless" not in with_ui and "--db-filename" not in with_ui


def test_free_port_is_bindable() -> None:
    port = free_port()
    assert not port_in_use(port)
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


# --- the shared session server ------------------------------------------------------------------


async def test_dev_server_has_search_attributes(dev_server: Any, temporal_client: Client) -> None:
    assert dev_server.address == f"127.0.0.1:{dev_server.port}"
    resp = await temporal_client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=dev_server.namespace)
    )
    registered = {
        name: IndexedValueType.Name(value) for name, value in resp.custom_attributes.items()
    }
    for name, type_ in ALL.items():
        expected = {"KeywordList": "KEYWORD_LIST"}.get(type_, type_.upper())
        assert registered.get(name) == f"INDEXED_VALUE_TYPE_{expected}", name


# --- own servers --------------------------------------------------------------------------------


async def test_restart_on_same_db_keeps_workflows(tmp_path: Path) -> None:
    server = DevServer(tmp_path, port=free_port(), ui_port=None)
    server.start()
    try:
        await server.wait_ready_async(timeout=60)
        first_pid = server.pid
        assert first_pid is not None
        client = await connect_client(server.address)
        workflow_id = f"persist-{uuid.uuid4()}"
        handle = await client.start_workflow(
            "NobodyRunsThis", id=workflow_id, task_queue=f"nobody-polls-{uuid.uuid4()}"
        )
        assert server.stop() is not None
        assert not pid_alive(first_pid)
        assert not port_in_use(server.port)

        server.start()
        await server.wait_ready_async(timeout=60)
        assert server.pid != first_pid
        client = await connect_client(server.address)
        desc = await client.get_workflow_handle(workflow_id).describe()
        assert desc.run_id == handle.result_run_id
        assert desc.status == WorkflowExecutionStatus.RUNNING
        assert desc.workflow_type == "NobodyRunsThis"
    finally:
        server.stop()
    assert server.pid is not None and not pid_alive(server.pid)
    assert server.log_path.exists()
    assert (tmp_path / "temporal.db").exists()


def test_sync_context_manager_and_kill(tmp_path: Path) -> None:
    with DevServer(tmp_path, port=free_port(), ui_port=None, search_attributes={}) as server:
        pid = server.pid
        assert pid is not None and pid_alive(pid)
        assert server.kill() == -signal.SIGKILL
        assert not pid_alive(pid)
    assert server.returncode == -signal.SIGKILL


def test_start_refuses_a_busy_port(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        server = DevServer(tmp_path, port=s.getsockname()[1], ui_port=None)
        with pytest.raises(DevServerError, match="already in use"):
            server.start()
    assert server.pid is None


async def test_wait_ready_reports_an_early_exit(tmp_path: Path) -> None:
    server = DevServer(
        tmp_path, port=free_port(), ui_port=None, search_attributes={"Broken": "NoSuchType"}
    )
    server.start()
    try:
        with pytest.raises(DevServerError, match="exited with status"):
            await server.wait_ready_async(timeout=30)
    finally:
        server.stop()


# --- procs.Child --------------------------------------------------------------------------------

PY = sys.executable


def test_child_stop_terminates_the_group(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    child = Child("parent")
    code = (
        "import subprocess, time; "
        "p = subprocess.Popen(['sleep', '60']); print('grandchild', p.pid, flush=True); "
        "time.sleep(60)"
    )
    child.start([PY, "-c", code], log_path=log)
    assert child.running and child.pid is not None
    grandchild = int(wait_for_text(log, "grandchild").split()[1])
    assert os.getpgid(child.pid) == child.pid  # its own process group
    assert child.stop(timeout=10) == -signal.SIGTERM
    assert not pid_alive(child.pid)
    deadline = time.monotonic() + 5
    while pid_alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(grandchild)


def test_child_stop_kills_after_timeout(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    child = Child("stubborn")
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(60)"
    )
    child.start([PY, "-c", code], log_path=log)
    wait_for_text(log, "ready")
    started = time.monotonic()
    assert child.stop(timeout=0.5) == -signal.SIGKILL
    # The child would sleep 60 s: anything well under that proves the kill (margin for load).
    assert time.monotonic() - started < 30


def test_child_env_overlay_and_kill(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BACKFILL_TEST_DROP", "x")
    log = tmp_path / "env.log"
    child = Child("env")
    code = (
        "import os, time; "
        "print('vars', os.environ.get('BACKFILL_TEST_ADD'), "
        "os.environ.get('BACKFILL_TEST_DROP'), flush=True); time.sleep(60)"
    )
    child.start(
        [PY, "-c", code], env={"BACKFILL_TEST_ADD": "1", "BACKFILL_TEST_DROP": None}, log_path=log
    )
    assert "vars 1 None" in wait_for_text(log, "vars")
    assert child.kill() == -signal.SIGKILL
    assert child.returncode == -signal.SIGKILL and not child.running


def test_a_child_dies_with_its_parent_however_the_parent_dies(tmp_path: Path) -> None:
    """`Child(die_with_parent=True)`: SIGKILL its parent (no cleanup runs) and the kernel kills
    it; without the flag it lives on, an orphan."""
    pids = {}
    for flag in (True, False):
        log = tmp_path / f"parent-{flag}.log"
        code = (
            "import time; from tools.dev.procs import Child; "
            f"c = Child('sleeper', die_with_parent={flag}, kill_at_exit=False); "
            "c.start(['sleep', '60']); print('child', c.pid, flush=True); time.sleep(60)"
        )
        parent = Child(f"parent-{flag}")
        parent.start([PY, "-c", code], env={"PYTHONPATH": str(REPO)}, log_path=log)
        pids[flag] = int(wait_for_text(log, "child", timeout=30).split()[1])
        assert parent.pid is not None
        os.kill(parent.pid, signal.SIGKILL)  # the parent alone: its child has a group of its own
        parent.wait(10)
    try:
        deadline = time.monotonic() + 5
        while pid_alive(pids[True]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not pid_alive(pids[True])
        assert pid_alive(pids[False])  # what the flag prevents
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pids[False], signal.SIGKILL)


def test_die_with_parent_needs_the_main_thread() -> None:
    """The parent-death signal fires when the thread that forked ends: a worker thread's child
    would die with the thread, so it is refused."""
    errors: list[BaseException] = []

    def start() -> None:
        try:
            Child("x", die_with_parent=True).start(["true"])
        except RuntimeError as e:
            errors.append(e)

    thread = threading.Thread(target=start)
    thread.start()
    thread.join()
    assert len(errors) == 1 and "main thread" in str(errors[0])


def test_child_exit_status(tmp_path: Path) -> None:
    child = Child("quick")
    child.start([PY, "-c", "raise SystemExit(3)"], log_path=tmp_path / "q.log")
    assert child.wait(10) == 3
    assert child.returncode == 3
    assert child.stop() == 3


# --- cli ----------------------------------------------------------------------------------------


def test_cli_hash_key_reads_the_key_from_stdin(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("sk-backfill-dev\n"))
    assert main(["hash-key"]) == 0
    out = capsys.readouterr().out.strip()
    assert out == hash_key("sk-backfill-dev")
    assert out in (REPO / "backfill.toml").read_text()
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert main(["hash-key"]) == 2
    with pytest.raises(SystemExit):  # never on the command line (shell history, ps)
        main(["hash-key", "sk-backfill-dev"])


def test_api_refuses_the_shipped_dev_key_off_loopback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("BACKFILL_CONFIG", str(REPO / "backfill.toml"))
    monkeypatch.setenv("BACKFILL_API_HOST", "0.0.0.0")
    assert main(["api"]) == 2
    assert "shipped dev key" in capsys.readouterr().err


def test_cli_bad_config_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[limits]\nmax_file_bytes = 0\n")
    monkeypatch.setenv("BACKFILL_CONFIG", str(bad))
    assert main(["worker"]) == 2
    assert "limits.max_file_bytes" in capsys.readouterr().err


def test_python_dash_m_backfill() -> None:
    out = subprocess.run(
        [PY, "-m", "tools", "hash-key"],
        input="abc\n",
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == hash_key("abc")
