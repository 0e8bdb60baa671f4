"""The CLI's rough edges a new user found (issue 39), driven as a user drives the CLI: a child
process on a pseudo-terminal and one without a terminal, against the real stack.

- `watch ID --download-to DIR` makes DIR (as `download --dir` does) instead of dying at the end;
- `submit --wait` on a batch whose input was refused says why (the codes and lines);
- `list`'s "why it waits" column says what the progress bar says;
- `get` on a paused batch says paused, not a pace that is "not moving";
- a second `retry --only failed` of the same original never sends a custom_id an earlier retry
  completed, and `retry --wait --dir DIR` makes DIR (issue 48);
- issue 48: `--help` needs no key; an invalid `--window` is refused before anything is uploaded;
  a base URL without `/v1` says so; at 80 columns the bar's status and count are never cut."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from rich.console import Console

from tests.e2e.conftest import MakeStack
from tests.e2e.stack import auth, input_ids, jsonl
from tests.e2e.test_cli import CLI_STACK, ROOT, Cli, cli
from tests.polling import poll_until
from tools.client.watching import Bar, View
from tools.sim import SimConfig
from tools.sim.faults import SimFault


async def run_cli(stack: object, *args: str, cwd: Path, tty: bool) -> tuple[int, str]:
    run = Cli(stack, list(args), cwd, tty=tty)  # type: ignore[arg-type]
    try:
        return await run.wait(120), run.text()
    finally:
        run.stop()


@pytest.mark.parametrize("tty", [True, False], ids=["terminal", "no-terminal"])
async def test_list_get_watch_and_a_refused_submit(
    make_stack: MakeStack, tmp_path: Path, tty: bool
) -> None:
    stack = await make_stack(cap=2, sim=SimConfig(model_names=[], latency_ms=400))
    source = tmp_path / "slow.jsonl"
    source.write_bytes(jsonl(40, prefix="slow"))
    rc, out = await run_cli(stack, "submit", str(source), cwd=tmp_path, tty=tty)
    assert rc == 0, out
    batch_id = re.search(r"Created (batch_\w+)", out).group(1)  # type: ignore[union-attr]

    # `list` says why lines wait, as the bar and `get` do: 40 lines on a route capped at 2.
    async def listed() -> str:
        return (await run_cli(stack, "list", cwd=tmp_path, tty=tty))[1]

    out = await poll_until(
        listed,
        lambda text: "At its batch limit" in text,
        timeout=60,
        what="`list` to show the batch limit",
        interval=0.5,
    )
    row = next(line for line in out.splitlines() if batch_id in line)
    assert "At its batch limit" in row, out

    # Paused: `get` says so, with no pace "not moving".
    async with httpx.AsyncClient(base_url=stack.api_url, headers=auth()) as http:
        assert (await http.post(f"/v1/batches/{batch_id}/pause")).status_code == 200
    rc, out = await run_cli(stack, "get", batch_id, cwd=tmp_path, tty=tty)
    assert rc == 0, out
    assert "in_progress (paused)" in out, out
    pace = next(line for line in out.splitlines() if line.strip().startswith("pace"))
    assert "paused" in pace and "lines/s" not in pace and "not moving" not in pace, out

    # `watch --download-to` a directory that does not exist yet: made, files saved there.
    target = tmp_path / "not" / "yet"
    watch = Cli(stack, ["watch", batch_id, "--download-to", str(target)], tmp_path, tty=tty)
    try:
        async with httpx.AsyncClient(base_url=stack.api_url, headers=auth()) as http:
            assert (await http.post(f"/v1/batches/{batch_id}/resume")).status_code == 200
        rc = await watch.wait(180)
    finally:
        watch.stop()
    out = watch.text()
    assert rc == 0, out
    assert "Traceback" not in out, out
    saved = (target / f"{batch_id}.output.jsonl").read_text().splitlines()
    assert sorted(json.loads(x)["custom_id"] for x in saved) == sorted(input_ids("slow", 40))

    # `submit --wait` of an input validation refuses: the reason, not "0 failed of 0".
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(jsonl(2, prefix="ok") + b"{not json\n")
    rc, out = await run_cli(stack, "submit", str(bad), "--wait", cwd=tmp_path, tty=tty)
    assert rc == 1, out
    assert "its input was refused" in out and "0 failed of 0" not in out, out
    assert re.search(r"invalid_json_line \(line 3\): ", out), out


async def test_a_second_retry_never_sends_what_an_earlier_retry_completed(
    lease_stack: MakeStack, tmp_path: Path
) -> None:
    n = 60
    stack = await lease_stack(**CLI_STACK)
    # A lease's simulator starts in its first state: 5 ms lines, the first 10 answered 500.
    stack.sim.app.config.latency_ms = 5
    stack.sim.app.faults.add([SimFault(status=500, count=10)])
    source = tmp_path / "in.jsonl"
    source.write_bytes(jsonl(n, prefix="r"))
    rc, out = await cli(stack, "submit", str(source), "--wait", cwd=tmp_path)
    assert rc == 0, out
    original = re.search(r"Created (batch_\w+)", out).group(1)  # type: ignore[union-attr]
    failed = {
        json.loads(x)["custom_id"] for x in (tmp_path / "in.errors.jsonl").read_text().splitlines()
    }
    assert len(failed) == 10

    # The first retry: 4 of the 10 fail again, 6 complete.
    stack.sim.app.faults.add([SimFault(status=500, count=4)])
    rc, out = await cli(stack, "retry", original, "--wait", "--dir", str(tmp_path), cwd=tmp_path)
    assert rc == 0, out
    first = re.search(r"Created (batch_\w+): 10 failed lines", out).group(1)  # type: ignore[union-attr]
    first_done = {
        json.loads(x)["custom_id"]
        for x in (tmp_path / f"{first}.output.jsonl").read_text().splitlines()
    }
    assert len(first_done) == 6

    client = stack.client()
    await poll_until(
        lambda: client.batches.retrieve(original),
        lambda b: (b.model_extra or {})["backfill"]["retries"] == [first],
        timeout=30,
        what="the original to list its first retry",
        interval=0.2,
    )
    # The second retry of the same original (on a terminal this time): only the 4 left, saved
    # in a directory that does not exist yet (made first, as `watch --download-to` does).
    later = tmp_path / "not" / "yet"
    rc, out = await run_cli(
        stack, "retry", original, "--wait", "--dir", str(later), cwd=tmp_path, tty=True
    )
    assert rc == 0, out
    assert "Traceback" not in out, out
    second = re.search(r"Created (batch_\w+): 4 failed lines", out)
    assert second is not None, out
    second_done = {
        json.loads(x)["custom_id"]
        for x in (later / f"{second.group(1)}.output.jsonl").read_text().splitlines()
    }
    assert second_done == failed - first_done

    # Every custom_id completed exactly once over the original and its retries.
    done = [
        json.loads(x)["custom_id"]
        for path in (
            tmp_path / "in.output.jsonl",
            tmp_path / f"{first}.output.jsonl",
            later / f"{second.group(1)}.output.jsonl",
        )
        for x in path.read_text().splitlines()
    ]
    assert sorted(done) == sorted(input_ids("r", n))

    # A third: nothing left, nothing created, and it says why.
    await poll_until(
        lambda: client.batches.retrieve(original),
        lambda b: len((b.model_extra or {})["backfill"]["retries"]) == 2,
        timeout=30,
        what="the original to list both retries",
        interval=0.2,
    )
    rc, out = await cli(stack, "retry", original, cwd=tmp_path)
    assert rc == 2 and "were completed by its retries" in out, out


def test_help_needs_no_key(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    env["PYTHONPATH"] = str(ROOT)
    for args in (["--help"], ["submit", "--help"], ["retry", "--help"]):
        done = subprocess.run(
            [sys.executable, "-m", "tools", "batch", *args],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "Usage: backfill batch" in done.stdout, done.stdout
        assert "OPENAI_API_KEY" not in done.stderr, done.stderr


async def test_bad_window_and_base_url_are_refused_before_anything_is_sent(
    lease_stack: MakeStack, tmp_path: Path
) -> None:
    stack = await lease_stack(**CLI_STACK)
    source = tmp_path / "in.jsonl"
    source.write_bytes(jsonl(3, prefix="w"))
    client = stack.client()
    before = [f.id async for f in client.files.list()]

    rc, out = await cli(stack, "submit", str(source), "--window", "5h", cwd=tmp_path)
    assert rc == 2, out
    assert "'5h' is not a completion window: one of 24h, 48h, 72h, 168h" in out, out
    assert [f.id async for f in client.files.list()] == before  # no orphaned upload

    # The base URL without /v1: the server has no /files; the CLI names the fix.
    run = Cli(
        stack,
        ["submit", str(source)],
        tmp_path,
        tty=False,
        env_extra={"OPENAI_BASE_URL": stack.api_url},
    )
    try:
        rc = await run.wait(120)
    finally:
        run.stop()
    out = run.text()
    assert rc == 2, out
    assert f"Set OPENAI_BASE_URL (or --base-url) to {stack.api_url}/v1" in out, out
    assert "Traceback" not in out, out


def test_at_80_columns_the_bar_never_cuts_its_count() -> None:
    """A long wait reason and at risk on an 80-column terminal: the status and `57/1000` are
    whole (they read `in_…` and nothing, or `57/1…`, before); the texts after them wrap."""
    buf = io.StringIO()
    console = Console(file=buf, width=80, force_terminal=True, color_system=None)
    bar = Bar(console)
    bar.show(
        View(
            batch_id="batch_x",
            status="in_progress",
            total=1000,
            completed=57,
            failed=0,
            lines_per_second=12.3,
            eta_seconds=3600,
            reason="Queued — waiting for capacity",
            at_risk=True,
        )
    )
    bar.close()
    shown = buf.getvalue()
    assert "57/1000" in shown and "in_progress" in shown, shown
    assert "…" not in shown, shown
