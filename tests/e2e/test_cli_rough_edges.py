"""The CLI's rough edges a new user found (issue 39), driven as a user drives the CLI: a child
process on a pseudo-terminal and one without a terminal, against the real stack.

- `watch ID --download-to DIR` makes DIR (as `download --dir` does) instead of dying at the end;
- `submit --wait` on a batch whose input was refused says why (the codes and lines);
- `list`'s "why it waits" column says what the progress bar says;
- `get` on a paused batch says paused, not a pace that is "not moving";
- a second `retry --only failed` of the same original never sends a custom_id an earlier retry
  completed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import MakeStack
from tests.e2e.stack import auth, input_ids, jsonl
from tests.e2e.test_cli import CLI_STACK, Cli, cli
from tests.polling import poll_until
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
    # The second retry of the same original (on a terminal this time): only the 4 left.
    rc, out = await run_cli(
        stack, "retry", original, "--wait", "--dir", str(tmp_path), cwd=tmp_path, tty=True
    )
    assert rc == 0, out
    second = re.search(r"Created (batch_\w+): 4 failed lines", out)
    assert second is not None, out
    second_done = {
        json.loads(x)["custom_id"]
        for x in (tmp_path / f"{second.group(1)}.output.jsonl").read_text().splitlines()
    }
    assert second_done == failed - first_done

    # Every custom_id completed exactly once over the original and its retries.
    done = [
        json.loads(x)["custom_id"]
        for name in ("in", first, second.group(1))
        for x in (tmp_path / f"{name}.output.jsonl").read_text().splitlines()
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
