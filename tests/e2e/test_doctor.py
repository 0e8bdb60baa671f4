"""`backfill doctor` against real deployments: a namespace registered before the sixth search
attribute existed, no worker, and a route whose server does not serve its model (the doctor
names each, and the command that adds the attribute; that command, run, fixes that check), and
a fresh `backfill dev` on moved ports, which the doctor follows without being told (every check
green)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from temporalio.client import Client
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError

from api.errors import unregistered_search_attribute
from backfill.batches import search_attributes as sa
from backfill.batches.search_attributes import ALL
from backfill.platform.config import hash_key
from tests.polling import poll_until
from tools.dev.devserver import DevServer, temporal_cli_path
from tools.dev.procs import Child, backfill_argv, free_port
from tools.sim import SimConfig, SimServer

ROOT = Path(__file__).resolve().parents[2]
KEY = "sk-test-doctor"


def config(path: Path, sim_base_url: str, *, unserved: str | None = None) -> Path:
    """One route to the simulator for model demo; with `unserved`, a second model of that name
    routed to the same simulator, which does not serve it."""
    more = []
    if unserved is not None:
        more = ["[[models]]", f'id = "{unserved}"', "[[models.routes]]"]
        more += [f'id = "{unserved}-sim"', f'base_url = "{sim_base_url}"']
    path.write_text(
        "\n".join(
            [
                "[[models]]",
                'id = "demo"',
                "[[models.routes]]",
                'id = "doctor-sim"',
                f'base_url = "{sim_base_url}"',
                *more,
                "[[api_keys]]",
                f'sha256 = "{hash_key(KEY)}"',
                'workspace = "dev"',
                'role = "member"',
            ]
        )
        + "\n"
    )
    return path


async def doctor(env: dict[str, str]) -> tuple[int, str]:
    proc = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "tools", "doctor"],
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc.returncode, proc.stdout + proc.stderr


async def test_a_namespace_missing_a_search_attribute(tmp_path: Path) -> None:
    older = {k: v for k, v in ALL.items() if k != "BackfillRetryOf"}  # as registered before it
    server = DevServer(tmp_path / "t", port=free_port(), ui_port=None, search_attributes=older)
    sim = SimServer(SimConfig(model_names=["demo"]))
    await sim.start()
    server.start()
    try:
        await server.wait_ready_async(timeout=60)
        env = {
            "BACKFILL_CONFIG": str(config(tmp_path / "b.toml", sim.base_url, unserved="ghost")),
            "BACKFILL_DATA_DIR": str(tmp_path / "data"),
            "TEMPORAL_ADDRESS": server.address,
            "TEMPORAL_NAMESPACE": server.namespace,
        }
        rc, out = await doctor(env)
        assert rc == 1, out
        command = (
            f"temporal operator search-attribute create --namespace {server.namespace} "
            "--name BackfillRetryOf --type Keyword"
        )
        assert "✗ search attributes: BackfillRetryOf (Keyword) is not registered" in out, out
        assert f"fix: {command}" in out, out
        assert f"✓ Temporal: reachable at {server.address}" in out, out
        assert f"✓ route doctor-sim: {sim.base_url} serves demo" in out, out
        # A model id the route's server does not serve: every line would be refused.
        assert (
            f"✗ route ghost-sim: {sim.base_url} does not serve model ghost (it serves: demo)" in out
        )
        # Nothing polls the task queue: batches would wait.
        assert "✗ worker: no worker polls task queue backfill" in out, out
        assert out.count("✗") == 3, out

        # Meanwhile the api answers a create that needs the attribute (a retry) with a 503 that
        # names it (api/errors.py): this server's refusal is one the api recognises.
        temporal = await Client.connect(server.address, namespace=server.namespace)
        link = [SearchAttributePair(sa.WORKSPACE, "dev"), SearchAttributePair(sa.RETRY_OF, "b")]
        with pytest.raises(RPCError) as refused:
            await temporal.start_workflow(
                "BatchWorkflow",
                id="batch_doctor_retry",
                task_queue="nobody-polls",
                search_attributes=TypedSearchAttributes(link),
            )
        assert unregistered_search_attribute(refused.value) == "BackfillRetryOf", refused.value

        # The command it prints, run as printed, fixes it.
        argv = [str(temporal_cli_path()), *command.split()[1:], "--address", server.address]
        done = await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        rc, out = await poll_until(
            lambda: doctor(env),
            lambda r: f"✓ search attributes: all {len(ALL)} registered" in r[1],
            timeout=60,
            what="the doctor to pass the search attributes once the attribute is added",
            interval=1,
        )
        assert out.count("✗") == 2, out  # the worker and the unserved model remain
    finally:
        await asyncio.to_thread(server.stop)
        await sim.stop()


async def test_a_fresh_dev_stack_on_moved_ports_is_all_green(tmp_path: Path) -> None:
    ports = {name: free_port() for name in ("temporal", "ui", "sim", "api", "worker-metrics")}
    toml = config(tmp_path / "b.toml", f"http://127.0.0.1:{ports['sim']}/v1")
    env = {
        "BACKFILL_CONFIG": str(toml),
        "BACKFILL_DATA_DIR": str(tmp_path / "data"),
        "BACKFILL_LOG_LEVEL": "INFO",
    }
    dev = Child("dev")
    argv = ["dev"] + [x for n, p in ports.items() for x in (f"--{n}-port", str(p))]
    dev.start(backfill_argv(*argv), env, tmp_path / "dev.log")
    log = tmp_path / "dev.log"
    try:
        await poll_until(
            lambda: dev.running and "backfill is running" in log.read_text(),
            lambda up: bool(up),
            timeout=120,
            what="`backfill dev` to be up",
            interval=0.5,
        )
        # The worker's metrics are on the port given, not 9464.
        async with httpx.AsyncClient(timeout=5, trust_env=False) as http:
            r = await poll_until(
                lambda: http.get(f"http://127.0.0.1:{ports['worker-metrics']}/metrics"),
                lambda r: r.status_code == 200,
                timeout=60,
                what="the worker's metrics on the port given",
                interval=0.5,
                ignore=(httpx.HTTPError,),
            )
        assert "gateway_" in r.text
        # No TEMPORAL_ADDRESS: the doctor finds the moved stack (data_dir/dev-stack.json).
        rc, out = await doctor(env)
        assert rc == 0, out
        assert f"✓ Temporal: reachable at 127.0.0.1:{ports['temporal']}" in out, out
        assert "✓ worker: task queue backfill is polled" in out, out
        assert "✗" not in out and "!" not in out.replace("fix:", ""), out
        assert "All checks passed" in out, out
    finally:
        dev.stop(timeout=20)
        assert dev.returncode is not None
