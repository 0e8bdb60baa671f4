"""The running `backfill dev`'s state file (`backfill.operations.dev_stack`), which `backfill
doctor` follows: believed only while the supervisor that wrote it runs, never for a dead or reused
pid, and removed only by its writer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from backfill.operations import dev_stack
from backfill.operations.doctor import follow_dev_stack
from backfill.platform.config import Settings
from tools.cli import main


def stack(pid: int, started: int | None) -> dev_stack.DevStack:
    return dev_stack.DevStack(
        pid=pid,
        pid_started=started,
        temporal_address="127.0.0.1:7243",
        temporal_namespace="default",
        task_queue="backfill",
        temporal_started=True,
        api_url="http://127.0.0.1:8010",
        simulator_url=None,
        worker_metrics_port=9474,
        preempt_token_set=True,
    )


def test_a_running_supervisor_s_stack_is_followed(tmp_path: Path) -> None:
    me = os.getpid()
    dev_stack.write(tmp_path, stack(me, dev_stack.process_started(me)))
    found = dev_stack.running(tmp_path)
    assert found is not None and found.temporal_address == "127.0.0.1:7243"
    assert "token" not in dev_stack.path(tmp_path).read_text().replace("preempt_token_set", "")
    dev_stack.remove(tmp_path, me + 1)  # another supervisor's stop leaves it
    assert dev_stack.running(tmp_path) is not None
    dev_stack.remove(tmp_path, me)
    assert dev_stack.running(tmp_path) is None and not dev_stack.path(tmp_path).exists()


def test_a_dead_or_reused_pid_is_not_followed(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dev_stack.write(tmp_path, stack(gone.pid, None))
    assert dev_stack.running(tmp_path) is None
    me = os.getpid()
    started = dev_stack.process_started(me)
    assert started is not None
    dev_stack.write(tmp_path, stack(me, started - 1))  # the pid now names another process
    assert dev_stack.running(tmp_path) is None


def test_an_unreadable_file_is_not_followed(tmp_path: Path) -> None:
    dev_stack.path(tmp_path).write_text("{not json")
    assert dev_stack.running(tmp_path) is None


def test_the_doctor_follows_the_running_stack_unless_told_an_address(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    me = os.getpid()
    dev_stack.write(tmp_path, stack(me, dev_stack.process_started(me)))
    monkeypatch.delenv("TEMPORAL_ADDRESS", raising=False)
    followed, found = follow_dev_stack(Settings(data_dir=tmp_path))
    assert found is not None and followed.temporal_address == "127.0.0.1:7243"
    monkeypatch.setenv("TEMPORAL_ADDRESS", "10.0.0.5:7233")
    told, found = follow_dev_stack(Settings(data_dir=tmp_path))
    assert found is None and told.temporal_address == "10.0.0.5:7233"


def test_backfill_dev_refuses_embedded_ports_beside_an_existing_temporal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc = main(["dev", "--temporal-address", "127.0.0.1:7299", "--temporal-port", "7300"])
    assert rc == 2
    assert "--temporal-port are the embedded dev server's" in capsys.readouterr().err
