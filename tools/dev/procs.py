"""Process plumbing: start a child in its own process group, stop it gracefully, kill it.

Used by `backfill dev` (the supervisor behind `make run`), by `DevServer`, and by tests that run
the real api, worker and simulator as processes (and SIGKILL the worker to test durability).

Every child gets its own session (and so its own process group): a terminal Ctrl-C reaches only
the supervisor, which then stops the children in order, instead of every process racing to
shut down at once. Signals go to the whole group, so grandchildren are not left behind.

A child started with `die_with_parent` is SIGKILLed by the kernel when the thread that started
it dies (Linux's parent-death signal, set between fork and exec and kept across exec, so it
holds for the Go `temporal` binary too): a supervisor that is SIGKILLed or OOM-killed, which
runs no cleanup, leaves no child behind holding its ports.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

from backfill.operations.dev_stack import process_alive

PR_SET_PDEATHSIG = 1
"""prctl(2) option: the signal this process gets when its parent thread dies (linux/prctl.h)."""


def _die_with(parent: int) -> Callable[[], None]:
    """A `preexec_fn`: in the forked child, ask for SIGKILL when the parent dies; if the parent
    died already (the child was reparented before the call), die now."""
    libc = ctypes.CDLL(None, use_errno=True)  # loaded before the fork: nothing to load after it

    def preexec() -> None:
        if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            os._exit(126)  # refuse to run a child that would outlive us
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


def backfill_argv(subcommand: str, *args: str) -> list[str]:
    """`python -m tools <subcommand> args...`: the `backfill` command with this interpreter."""
    return [sys.executable, "-m", "tools", subcommand, *args]


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """True when something listens on host:port (a bind with SO_REUSEADDR fails)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (bind to port 0 and ask)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def wait_for_port(port: int, host: str = "127.0.0.1", timeout: float = 10.0) -> bool:
    """Poll until host:port accepts a TCP connection; False on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.1)
    return False


def pid_alive(pid: int) -> bool:
    """True when a process with this pid exists and is not a zombie."""
    return process_alive(pid)


class Child:
    """One child process in its own process group.

    `start(argv, env, log_path)`: env entries are added to (and override) this process's
    environment, a None value removes that variable; log_path None means the child inherits
    stdout/stderr, otherwise both are appended to that file. `stop()` sends SIGTERM to the
    group, waits, then SIGKILLs it.
    A child still running when this interpreter exits is killed (kill_at_exit); with
    die_with_parent (Linux only, started from the main thread) the kernel kills it when this
    process dies in any way, SIGKILL included.
    """

    def __init__(
        self, name: str, *, kill_at_exit: bool = True, die_with_parent: bool = False
    ) -> None:
        if die_with_parent and not sys.platform.startswith("linux"):
            raise ValueError("die_with_parent needs Linux's PR_SET_PDEATHSIG")
        self.name = name
        self.die_with_parent = die_with_parent
        self.argv: list[str] = []
        self.log_path: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._kill_at_exit = kill_at_exit
        self._atexit_registered = False
        self._swept = False

    def __repr__(self) -> str:
        return f"Child({self.name!r}, pid={self.pid}, returncode={self.returncode})"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def returncode(self) -> int | None:
        """None while running (or never started); the exit status once it has exited
        (negative: killed by that signal)."""
        return self._proc.poll() if self._proc is not None else None

    @property
    def started(self) -> bool:
        return self._proc is not None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(
        self,
        argv: Sequence[str],
        env: Mapping[str, str | None] | None = None,
        log_path: Path | None = None,
        *,
        cwd: Path | None = None,
    ) -> None:
        if self._proc is not None and self._proc.poll() is None:
            raise RuntimeError(f"{self.name} is already running (pid {self._proc.pid})")
        self._close_log()
        self.argv = list(argv)
        self.log_path = log_path
        full_env = dict(os.environ)
        for key, value in (env or {}).items():
            if value is None:
                full_env.pop(key, None)
            else:
                full_env[key] = value
        out: IO[bytes] | None = None
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            out = self._log = open(log_path, "ab")  # closed in stop()/kill()
        self._swept = False
        preexec: Callable[[], None] | None = None
        if self.die_with_parent:
            # The signal fires when the *thread* that forked dies: only the main thread lives
            # as long as the process.
            if threading.current_thread() is not threading.main_thread():
                raise RuntimeError(
                    f"{self.name}: die_with_parent children start from the main thread"
                )
            preexec = _die_with(os.getpid())
        try:
            self._proc = subprocess.Popen(
                self.argv,
                env=full_env,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT if out is not None else None,
                start_new_session=True,
                preexec_fn=preexec,
            )
        except BaseException:
            self._close_log()
            raise
        if self._kill_at_exit and not self._atexit_registered:
            atexit.register(self._at_exit)
            self._atexit_registered = True

    def send_signal(self, sig: int) -> None:
        """Send sig to the child's process group (no-op once it has exited)."""
        if self._proc is None or self._proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, sig)

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait up to timeout seconds; the exit status, or None if still running."""
        if self._proc is None:
            return None
        try:
            return self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout: float = 10.0, sig: int = signal.SIGTERM) -> int | None:
        """SIGTERM the group, wait up to timeout, then SIGKILL. Returns the exit status
        (None if never started)."""
        if self._proc is None:
            return None
        if self._proc.poll() is None:
            self.send_signal(sig)
            if self.wait(timeout) is None:
                self.send_signal(signal.SIGKILL)
                self._proc.wait()
        self._sweep()
        self._close_log()
        return self._proc.returncode

    def kill(self) -> int | None:
        """SIGKILL the group at once and reap the child; the exit status."""
        if self._proc is None:
            return None
        self.send_signal(signal.SIGKILL)
        self._proc.wait()
        self._sweep()
        self._close_log()
        return self._proc.returncode

    def log_tail(self, max_bytes: int = 4000) -> str:
        """The end of the log file (empty when the child logs to the terminal)."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            return f.read().decode(errors="replace")

    def _sweep(self) -> None:
        # The leader has been reaped: kill anything it left in its group (once, so a later
        # stop() cannot hit a reused pid).
        if self._proc is not None and not self._swept:
            self._swept = True
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, signal.SIGKILL)

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def _at_exit(self) -> None:
        if self.running:
            self.kill()
