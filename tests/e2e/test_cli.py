"""The client CLI (`backfill batch`, tools/client) driven as a user drives it: a subprocess on
a pseudo-terminal (the live progress bar) and one without a terminal (plain lines), against the
real stack. Also retry of failed lines, and partial results fetched while a batch runs."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.e2e.conftest import MakeStack
from tests.e2e.stack import Stack, input_ids, jsonl
from tests.polling import poll_until
from tools.sim import SimConfig
from tools.sim.faults import SimFault

ROOT = Path(__file__).resolve().parents[2]
CLI_STACK: dict[str, Any] = {"cap": 4, "sim": SimConfig(model_names=[], latency_ms=200)}
"""The shared stack the CLI tests lease (a test sets its simulator's latency and faults)."""
ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")


class Cli:
    """`backfill batch <args>` as a child process; its output collected as it comes."""

    def __init__(
        self,
        stack: Stack,
        args: list[str],
        cwd: Path,
        *,
        tty: bool,
        columns: int = 180,
        env_extra: dict[str, str] | None = None,
    ) -> None:
        """`columns`: the terminal's width (with `tty`); `env_extra`: variables to set (the
        stack's base URL and key are set unless given here)."""
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "OPENAI_BASE_URL": f"{stack.api_url}/v1",
            "OPENAI_API_KEY": stack.key(),
            "TERM": "xterm-256color",
            **(env_extra or {}),
        }
        env.pop("COLUMNS", None)
        argv = [sys.executable, "-m", "tools", "batch", *args]
        self.output = bytearray()
        self.lock = threading.Lock()
        if tty:
            master, child = pty.openpty()
            fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
            self.proc = subprocess.Popen(
                argv, stdin=child, stdout=child, stderr=child, env=env, cwd=cwd
            )
            os.close(child)
            self.reader = threading.Thread(
                target=self._read_fd, args=(master, lambda: os.close(master)), daemon=True
            )
        else:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=cwd,
            )
            stdout = self.proc.stdout
            assert stdout is not None
            # The pipe is closed through its file object, which owns it: an os.close of its
            # number left the object to close that number again when collected, by then
            # another child's pipe (EBADF in a later Popen, or worse, its pipe closed).
            self.reader = threading.Thread(
                target=self._read_fd, args=(stdout.fileno(), stdout.close), daemon=True
            )
        self.reader.start()

    def _read_fd(self, fd: int, close: Callable[[], None]) -> None:
        while True:
            try:
                data = os.read(fd, 65536)
            except OSError:  # EIO: the terminal's other side closed
                break
            if not data:
                break
            with self.lock:
                self.output += data
        with contextlib.suppress(OSError):
            close()

    def text(self) -> str:
        """The output so far, without terminal escapes."""
        with self.lock:
            data = bytes(self.output)
        return ANSI.sub(b"", data).decode(errors="replace").replace("\r", "\n")

    async def wait(self, within: float = 300) -> int:
        rc = await asyncio.wait_for(asyncio.to_thread(self.proc.wait), within)
        await asyncio.to_thread(self.reader.join, 10)
        return rc

    async def seen(self, pattern: str, within: float = 120) -> re.Match[str]:
        found = await poll_until(
            lambda: re.search(pattern, self.text()),
            lambda m: m is not None,
            timeout=within,
            what=f"{pattern!r} in the CLI's output",
            interval=0.1,
        )
        assert found is not None
        return found

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


async def cli(stack: Stack, *args: str, cwd: Path, within: float = 300) -> tuple[int, str]:
    """Run to the end without a terminal: exit code and output."""
    run = Cli(stack, list(args), cwd, tty=False)
    try:
        return await run.wait(within), run.text()
    finally:
        run.stop()


@pytest.mark.parametrize("tty", [True, False], ids=["terminal", "no-terminal"])
async def test_submit_wait_shows_progress_through_a_pause_and_saves_the_files(
    lease_stack: MakeStack, tmp_path: Path, tty: bool
) -> None:
    # At most 4 lines of 200 ms at once (20 lines/s): after the first fifth, the pause has 8 s
    # or more to land before the last line would finish, however fast the machine.
    stack = await lease_stack(**CLI_STACK)
    n = 200
    source = tmp_path / "requests.jsonl"
    source.write_bytes(jsonl(n, prefix="cli"))
    run = Cli(stack, ["submit", str(source), "--wait", "--interval", "0.5"], tmp_path, tty=tty)
    try:
        batch_id = (await run.seen(r"Created (batch_\w+)")).group(1)
        client = stack.client()
        await poll_until(
            lambda: client.batches.retrieve(batch_id),
            lambda b: b.request_counts is not None and b.request_counts.completed >= n // 5,
            timeout=180,
            what="a fifth of the lines done",
            interval=0.2,
        )
        async with httpx.AsyncClient(base_url=stack.api_url, headers=stack.auth()) as http:
            assert (await http.post(f"/v1/batches/{batch_id}/pause")).status_code == 200
            await run.seen(r"Paused by alpha-key")
            paused = await client.batches.retrieve(batch_id)
            assert paused.status == "in_progress" and paused.request_counts.completed < n
            assert (await http.post(f"/v1/batches/{batch_id}/resume")).status_code == 200
        rc = await run.wait()
    finally:
        run.stop()
    out = run.text()
    assert rc == 0, out
    assert f"{batch_id} completed: {n} completed, 0 failed of {n}" in out
    if tty:
        assert b"\x1b[" in run.output  # drawn in place on the terminal
        assert re.search(rf"\b{n}/{n}\b", out), out[-2000:]
        assert "lines/s" in out and "ETA" in out
    else:
        assert b"\x1b[" not in run.output  # plain lines for logs
        assert f"{n}/{n} done ({n} completed, 0 failed)" in out
    saved = (tmp_path / "requests.output.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["custom_id"] for line in saved) == sorted(input_ids("cli", n))
    assert not (tmp_path / "requests.errors.jsonl").exists()


async def test_retry_of_failed_lines_completes_exactly_those(
    make_stack: MakeStack, tmp_path: Path
) -> None:
    sim = SimConfig(model_names=[], latency_ms=5, faults=[SimFault(status=400, rate=0.05)])
    stack = await make_stack(cap=8, sim=sim)
    n = 200  # the simulator's faults are seeded: 12 of the first 200 draws fail
    source = tmp_path / "in.jsonl"
    source.write_bytes(jsonl(n, prefix="r"))
    rc, out = await cli(stack, "submit", str(source), "--wait", cwd=tmp_path)
    assert rc == 0, out  # completed, with failed lines
    original = re.search(r"Created (batch_\w+)", out).group(1)  # type: ignore[union-attr]
    done = [json.loads(x) for x in (tmp_path / "in.output.jsonl").read_text().splitlines()]
    failed = [json.loads(x) for x in (tmp_path / "in.errors.jsonl").read_text().splitlines()]
    failed_ids = {r["custom_id"] for r in failed}
    assert 5 <= len(failed_ids) <= 50 and all(r["response"]["status_code"] == 400 for r in failed)

    # A 400 would fail again: excluded, nothing is left, and nothing is created.
    rc, out = await cli(stack, "retry", original, "--skip-status", "400", cwd=tmp_path)
    assert rc == 2 and "Nothing to retry" in out, out
    rc, out = await cli(stack, "retry", original, "--only", "expired", cwd=tmp_path)
    assert rc == 2 and "Nothing to retry" in out, out

    stack.sim.app.faults.clear()  # the upstream recovered
    rc, out = await cli(
        stack, "retry", original, "--only", "failed", "--wait", "--dir", str(tmp_path), cwd=tmp_path
    )
    assert rc == 0, out
    retry_id = re.search(r"Created (batch_\w+)", out).group(1)  # type: ignore[union-attr]
    redone = [
        json.loads(x) for x in (tmp_path / f"{retry_id}.output.jsonl").read_text().splitlines()
    ]
    assert {r["custom_id"] for r in redone} == failed_ids and len(redone) == len(failed_ids)
    assert not (tmp_path / f"{retry_id}.errors.jsonl").exists()
    union = [r["custom_id"] for r in done + redone]
    assert sorted(union) == sorted(input_ids("r", n))  # every custom_id exactly once

    client = stack.client()
    retried = await client.batches.retrieve(retry_id)
    assert retried.metadata == {"retry_of": original}
    linked = await poll_until(
        lambda: client.batches.retrieve(original),
        lambda b: (b.model_extra or {})["backfill"]["retries"],
        timeout=30,
        what="the original to list its retry",
        interval=0.2,
    )
    assert linked.model_extra["backfill"]["retries"] == [retry_id]
    rc, out = await cli(stack, "get", original, cwd=tmp_path)
    assert rc == 0 and f"retries      {retry_id}" in out, out


async def test_partial_fetches_at_any_time_add_up_to_the_final_files(
    lease_stack: MakeStack,
) -> None:
    stack = await lease_stack(**CLI_STACK)
    # A lease's simulator starts in its first state: these lines are 30 ms, 1 in 10 fails.
    stack.sim.app.config.latency_ms = 30
    stack.sim.app.faults.add([SimFault(status=400, rate=0.1)])
    http = httpx.Client(base_url=stack.api_url, headers=stack.auth(), timeout=60)

    def fetch(batch_id: str, after: str | None, limit: int) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit}
        if after is not None:
            params["after"] = after
        resp = http.get(f"/v1/batches/{batch_id}/results", params=params)
        assert resp.status_code == 200, resp.text
        return resp.json()  # type: ignore[no-any-return]

    @settings(max_examples=2, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        pauses=st.lists(st.floats(0, 0.6), min_size=1, max_size=12),
        limits=st.lists(st.integers(1, 120), min_size=1, max_size=12),
    )
    def partial_fetches_add_up(pauses: list[float], limits: list[int]) -> None:
        n = 150
        f = http.post("/v1/files", files={"file": ("p.jsonl", jsonl(n))}, data={"purpose": "batch"})
        body = {"input_file_id": f.json()["id"], "endpoint": "/v1/chat/completions"}
        batch_id = http.post("/v1/batches", json={**body, "completion_window": "24h"}).json()["id"]
        got: list[dict[str, Any]] = []
        after: str | None = None
        for i, pause in enumerate(pauses):  # while it runs, at random moments
            time.sleep(pause)
            page = fetch(batch_id, after, limits[i % len(limits)])
            got += page["data"]
            after = page["next_after"]
        deadline = time.monotonic() + 180
        while http.get(f"/v1/batches/{batch_id}").json()["status"] != "completed":
            assert time.monotonic() < deadline, "the batch did not complete"
            time.sleep(0.2)
        more = True
        while more:
            page = fetch(batch_id, after, 50)
            got += page["data"]
            after, more = page["next_after"], page["has_more"]
        batch = http.get(f"/v1/batches/{batch_id}").json()
        files = {}
        for kind, key in (("output", "output_file_id"), ("error", "error_file_id")):
            text = http.get(f"/v1/files/{batch[key]}/content").text if batch[key] else ""
            files[kind] = [json.loads(line) for line in text.splitlines()]
        assert [g["record"] for g in got if g["file"] == "output"] == files["output"]
        assert [g["record"] for g in got if g["file"] == "error"] == files["error"]
        assert len(files["output"]) + len(files["error"]) == n

    try:
        await asyncio.to_thread(partial_fetches_add_up)
        # Another workspace's batch is not there at all.
        batch_id = (await stack.client().batches.list()).data[0].id
        async with httpx.AsyncClient(base_url=stack.api_url) as other:
            resp = await other.get(
                f"/v1/batches/{batch_id}/results", headers=stack.auth("sk-test-beta")
            )
        assert resp.status_code == 404 and resp.json()["error"]["param"] == "batch_id"
    finally:
        await asyncio.to_thread(http.close)
