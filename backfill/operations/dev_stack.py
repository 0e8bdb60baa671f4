"""The running `backfill dev`'s addresses, for `backfill doctor`: a state file under the data
directory (`dev-stack.json`).

`backfill dev` may run on moved ports (`--temporal-port`, `--api-port`, ...) or against a
Temporal it did not start (`--temporal-address`); its processes get those addresses in their
environment, which a doctor run from another shell does not have. The supervisor writes this file
once its stack is up and removes it when it stops; the doctor believes it only while the
supervisor that wrote it is still running (a SIGKILLed supervisor leaves it behind). No secret
is written: whether the stack made a preemption token, not the token.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

FILENAME = "dev-stack.json"


class DevStack(BaseModel):
    """What a running `backfill dev` serves, and where."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    pid: int
    """The supervisor's process id."""
    pid_started: int | None
    """The supervisor's start time (`/proc/<pid>/stat`, clock ticks since boot; None off
    Linux): a pid reused by another process after a SIGKILL is not taken for the supervisor."""
    temporal_address: str
    temporal_namespace: str
    task_queue: str
    temporal_started: bool
    """True when `backfill dev` runs the Temporal dev server itself; False for an existing
    Temporal (`--temporal-address`)."""
    api_url: str
    simulator_url: str | None
    """None when no route points at the simulator (it is not started)."""
    worker_metrics_port: int
    preempt_token_set: bool
    """The supervisor gave its api and worker a `BACKFILL_PREEMPT_TOKEN` of their own."""


def path(data_dir: Path) -> Path:
    return Path(data_dir) / FILENAME


def process_started(pid: int) -> int | None:
    """The start time of process `pid` in clock ticks since boot, None when unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Fields after the parenthesised command name; starttime is field 22 (the 20th after it).
    fields = stat.rsplit(")", 1)[-1].split()
    return int(fields[19]) if len(fields) > 19 else None


def write(data_dir: Path, stack: DevStack) -> None:
    """Replace the state file at once (a reader never sees half of it)."""
    target = path(data_dir)
    tmp = target.with_suffix(".tmp")
    tmp.write_text(stack.model_dump_json(indent=2) + "\n")
    os.replace(tmp, target)


def remove(data_dir: Path, pid: int) -> None:
    """Remove the state file if the supervisor `pid` wrote it."""
    found = _read(path(data_dir))
    if found is not None and found.pid == pid:
        with contextlib.suppress(FileNotFoundError):
            path(data_dir).unlink()


def running(data_dir: Path) -> DevStack | None:
    """The stack described under data_dir while its supervisor runs, else None."""
    found = _read(path(data_dir))
    if found is None or not process_alive(found.pid):
        return None
    if found.pid_started is not None and process_started(found.pid) != found.pid_started:
        return None
    return found


def _read(file: Path) -> DevStack | None:
    try:
        return DevStack.model_validate_json(file.read_bytes())
    except (OSError, ValidationError):
        return None


def process_alive(pid: int) -> bool:
    """The process exists and is not a zombie (a killed supervisor its parent has not reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc: kill(0) said it exists
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")
