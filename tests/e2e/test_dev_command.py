"""`backfill dev` (what `make run` runs) starts the dev server, simulator, worker and api on the
ports it is given, runs a batch, and on SIGTERM stops everything and exits 0."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import httpx

from backfill.platform.config import DEV_KEY, hash_key
from tests.e2e.test_dev_local_server import run_batch
from tests.polling import poll_until
from tools.dev.procs import Child, backfill_argv, free_port, pid_alive, port_in_use

KEY = DEV_KEY
"""The repository's public dev key: served only because `backfill dev` declares a development
stack (`BACKFILL_DEV_STACK`, `backfill.platform.config.check_exposure`)."""


async def test_backfill_dev_starts_runs_a_batch_and_stops_cleanly(tmp_path: Path) -> None:
    ports = {name: free_port() for name in ("temporal", "ui", "sim", "api")}
    config = tmp_path / "backfill.toml"
    config.write_text(
        "\n".join(
            [
                "[[models]]",
                'id = "demo"',
                "[[models.routes]]",
                'id = "dev-sim"',
                # The route must point at the simulator `backfill dev` starts.
                f'base_url = "http://127.0.0.1:{ports["sim"]}/v1"',
                "max_concurrent_lines = 2",
                "[[api_keys]]",
                f'sha256 = "{hash_key(KEY)}"',
                'workspace = "dev"',
                'role = "member"',
                'name = "dev-key"',
            ]
        )
        + "\n"
    )
    dev = Child("dev")
    dev.start(
        backfill_argv(
            "dev",
            "--temporal-port",
            str(ports["temporal"]),
            "--ui-port",
            str(ports["ui"]),
            "--sim-port",
            str(ports["sim"]),
            "--api-port",
            str(ports["api"]),
        ),
        {
            "BACKFILL_CONFIG": str(config),
            "BACKFILL_DATA_DIR": str(tmp_path / "data"),
            "BACKFILL_LOG_LEVEL": "INFO",
        },
        tmp_path / "dev.log",
    )
    log = tmp_path / "dev.log"
    try:
        api = f"http://127.0.0.1:{ports['api']}"

        async def healthz() -> int:
            assert dev.running, log.read_text()[-3000:]
            async with httpx.AsyncClient(timeout=5, trust_env=False) as http:
                return (await http.get(f"{api}/healthz")).status_code

        await poll_until(
            healthz,
            lambda code: code == 200,
            timeout=120,
            what="`backfill dev` to answer /healthz",
            interval=0.5,
            ignore=(httpx.HTTPError,),
        )
        await poll_until(
            lambda: "backfill is running" in log.read_text(),
            timeout=30,
            what="the 'backfill is running' banner",
        )
        # The whole system works: a batch runs through the simulator it started.
        await run_batch(api, model="demo")
        children = [int(p) for p in re.findall(r"started \w+ \(pid (\d+)\)", log.read_text())]
        assert len(children) == 3, log.read_text()[-3000:]

        # SIGTERM to `backfill dev` alone (not its process group): it stops its children.
        assert dev.pid is not None
        os.kill(dev.pid, signal.SIGTERM)
        await poll_until(
            lambda: dev.returncode, lambda rc: rc is not None, timeout=90, what="dev to exit"
        )
        assert dev.returncode == 0, log.read_text()[-3000:]
        assert not [p for p in children if pid_alive(p)], "a child outlived `backfill dev`"
        busy = [name for name, port in ports.items() if port_in_use(port, "127.0.0.1")]
        assert busy == [], f"still listening: {busy}"
    finally:
        dev.stop(timeout=10)
