"""Every command block a reader is told to run, run: the README's first batch and every `sh` and
`python` block of the user guide (docs/batches.md) and of docs/recipes.md.

A block that cannot run here is preceded by `<!-- not run: reason -->` (it needs a GPU, Docker,
a deployment of your own...); every other block runs, exactly as written but for the names this
machine must change:

- blocks of the README and the user guide run against a real stack (tests/e2e/stack.py), with
  `OPENAI_BASE_URL`/`OPENAI_API_KEY` set to it, and the dev setup's names (`127.0.0.1:8000`,
  `sk-backfill-dev`, the route `demo-sim`, the simulator's `127.0.0.1:8100`) replaced by the
  stack's;
- docs/recipes.md's blocks run in order, start to finish, in one scratch directory: the
  walkthrough starts its own dev server, simulator, worker and api, on free ports instead of
  7233, 8000 and 8100, under a temporary directory instead of `/tmp/walk`. The processes it starts
  in the background are ended by process group when the test ends.

`.venv/bin/` is this interpreter's directory."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.stack import Stack
from tools.dev.procs import free_port

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
STACK_DOCS = ("README.md", "docs/batches.md")
"""Pages whose blocks run against the test's stack."""
RECIPES = "docs/recipes.md"
NOT_RUN = re.compile(r"<!-- not run: (\S.*?) -->")
FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
BLOCK_TIMEOUT = 300.0
"""Seconds one block may take (the walkthrough's first block waits for a dev server)."""


@dataclass(frozen=True)
class Block:
    doc: str
    line: int
    lang: str
    code: str
    not_run: str | None
    """The reason given in `<!-- not run: ... -->` right before the block, if any."""

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}"


def blocks(doc: str) -> list[Block]:
    """The `sh` and `python` blocks of `doc`, in order (indented ones in lists included)."""
    lines = (ROOT / doc).read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m or not m.group(2):
            i += 1
            continue
        indent, lang, start = m.group(1), m.group(2), i
        body = []
        i += 1
        while not lines[i].strip() == "```":
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i])
            i += 1
        i += 1
        if lang not in ("sh", "python"):
            continue
        before = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        reason = NOT_RUN.search(before)
        found.append(
            Block(doc, start + 1, lang, "\n".join(body) + "\n", reason.group(1) if reason else None)
        )
    return found


def runnable(doc: str) -> list[Block]:
    return [b for b in blocks(doc) if b.not_run is None]


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without backfill's, Temporal's or OpenAI's settings (a block
    must say what it needs), `.venv/bin` first on PATH."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("BACKFILL_", "TEMPORAL_", "OPENAI_", "GATEWAY_"))
    }
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    return {**env, **extra}


class Runner:
    """Runs blocks as child processes, each in a process group of its own, and ends the groups
    it started (background processes of a block included) at `close`."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.cwd = cwd
        self.env = env
        self.groups: list[int] = []

    async def run(self, block: Block, code: str) -> str:
        argv = (
            ["bash", "-e", "-o", "pipefail", "-c", code]
            if block.lang == "sh"
            else [sys.executable, "-c", code]
        )
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=self.cwd,
            env=self.env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        self.groups.append(proc.pid)
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), BLOCK_TIMEOUT)
        except TimeoutError:
            pytest.fail(f"{block} did not finish within {BLOCK_TIMEOUT:.0f} s")
        text = out.decode(errors="replace")
        assert proc.returncode == 0, f"{block} exited {proc.returncode}:\n{code}\n---\n{text}"
        return text

    async def close(self) -> None:
        for pgid in self.groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGTERM)
        for _ in range(100):  # up to 10 s for the processes to stop on SIGTERM
            if not any(_group_alive(g) for g in self.groups):
                return
            await asyncio.sleep(0.1)
        for pgid in self.groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_every_block_runs_or_says_why_not() -> None:
    all_blocks = [b for doc in (*STACK_DOCS, RECIPES) for b in blocks(doc)]
    assert any(b.doc == "README.md" and b.lang == "python" for b in runnable("README.md"))
    assert len(runnable(RECIPES)) >= 3, "the recipes' walkthrough has its blocks"
    for b in all_blocks:
        assert b.not_run is None or len(b.not_run) > 5, f"{b}: a not-run block needs a reason"


def stack_code(code: str, stack: Stack) -> str:
    """The dev setup's names replaced by the stack's."""
    return (
        code.replace("http://127.0.0.1:8000", stack.api_url)
        .replace("http://127.0.0.1:8100", stack.sim.base_url.removesuffix("/v1"))
        .replace("sk-backfill-dev", "sk-test-admin")
        .replace("demo-sim", stack.route_id)
        .replace(".venv/bin/", f"{BIN}/")
    )


@pytest.mark.parametrize(
    "block",
    [b for doc in STACK_DOCS for b in runnable(doc)],
    ids=str,
)
async def test_the_readme_and_user_guide_blocks_run(
    block: Block, stack: Stack, tmp_path: Path
) -> None:
    env = clean_env(OPENAI_BASE_URL=f"{stack.api_url}/v1", OPENAI_API_KEY="sk-test-alpha")
    runner = Runner(tmp_path, env)
    try:
        out = await runner.run(block, stack_code(block.code, stack))
    finally:
        await runner.close()
    if block.doc == "README.md" and block.lang == "python":  # the first batch
        assert "created batch_" in out
        assert re.search(r"^completed ", out, re.M), out
        assert "'paused': False" in out, out
    if "/gateway/v1" in block.code:  # the single-job example: queued with its model, completed
        assert out.startswith("queued demo\n"), out
        assert re.search(r"^completed( 1 200)?$", out, re.M), out


async def test_the_recipes_run_start_to_finish(tmp_path: Path) -> None:
    ports = {"7233": free_port(), "8000": free_port(), "8100": free_port()}

    def local(code: str) -> str:
        code = code.replace("/tmp/walk", f"{tmp_path}/walk").replace(".venv/bin/", f"{BIN}/")
        for port, mine in ports.items():
            code = re.sub(rf"(?<![\d.]){port}\b", str(mine), code)
        return code

    runner = Runner(tmp_path, clean_env(NEW_KEY="sk-test-recipes"))
    outputs = []
    try:
        for block in runnable(RECIPES):
            outputs.append(await runner.run(block, local(block.code)))
    finally:
        await runner.close()
    text = "\n".join(outputs)
    assert re.search(r"^[0-9a-f]{64}$", text, re.M), "hash-key printed a SHA-256"
    assert "['llama-3.1-8b']" in text
    assert "completed" in text
    assert '{"priority_hint":10,"max_concurrent_lines":8}' in text
    assert "insufficient_role" in text
