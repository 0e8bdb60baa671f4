"""`backfill dev` (what `make run` runs) wires preemptive yield's channel (issue 34, item 5): with
`deploy/examples/batch-scheduling/bursty-vllm.json` PUT on the dev route, a live request that
needs a seat the batch holds ends a batch line, and the route's status shows it. Nothing is set
by hand: the token is made for the run and the api finds the worker on the task queue."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import httpx
import openai

from backfill.platform.config import DEV_KEY, hash_key
from tests.e2e.stack import jsonl
from tests.polling import poll_until
from tools.dev.procs import Child, backfill_argv, free_port

ADMIN = "sk-dev-preempt-admin"
EXAMPLE = Path(__file__).parents[2] / "deploy/examples/batch-scheduling/bursty-vllm.json"
SHARED = 14
"""The example's seats less those kept free (16 − 2)."""


def config(sim_port: int) -> str:
    lines = [
        "[[models]]",
        'id = "demo"',
        "[[models.routes]]",
        'id = "dev-sim"',
        f'base_url = "http://127.0.0.1:{sim_port}/v1"',
        "max_concurrent_lines = 2",
    ]
    for key, ws, role in ((DEV_KEY, "dev", "member"), (ADMIN, "ops", "platform_admin")):
        lines += ["[[api_keys]]", f'sha256 = "{hash_key(key)}"']
        lines += [f'workspace = "{ws}"', f'role = "{role}"', f'name = "{ws}-key"']
    return "\n".join(lines) + "\n"


async def test_make_run_preempts_with_the_shipped_example(tmp_path: Path) -> None:
    ports = {name: free_port() for name in ("temporal", "ui", "sim", "api")}
    (tmp_path / "backfill.toml").write_text(config(ports["sim"]))
    dev = Child("dev")
    dev.start(
        backfill_argv(
            "dev",
            *("--temporal-port", str(ports["temporal"]), "--ui-port", str(ports["ui"])),
            *("--sim-port", str(ports["sim"]), "--api-port", str(ports["api"])),
        ),
        {
            "BACKFILL_CONFIG": str(tmp_path / "backfill.toml"),
            "BACKFILL_DATA_DIR": str(tmp_path / "data"),
            "BACKFILL_LOG_LEVEL": "INFO",
        },
        tmp_path / "dev.log",
    )
    api = f"http://127.0.0.1:{ports['api']}"
    admin = {"Authorization": f"Bearer {ADMIN}"}
    url = f"{api}/api/v1/platform/deployments/dev-sim/batch-scheduling"
    try:
        async with httpx.AsyncClient(timeout=30, trust_env=False) as http:

            async def healthz() -> int:
                assert dev.running, (tmp_path / "dev.log").read_text()[-3000:]
                return (await http.get(f"{api}/healthz")).status_code

            await poll_until(
                healthz,
                lambda code: code == 200,
                timeout=120,
                what="`backfill dev` to answer /healthz",
                interval=0.5,
                ignore=(httpx.HTTPError,),
            )
            r = await http.put(url, json=json.loads(EXAMPLE.read_text()), headers=admin)
            assert r.status_code == 200, r.text
            # Every request to the simulator takes 20 s: the batch's lines hold their seats.
            sim = f"http://127.0.0.1:{ports['sim']}"
            fault = {"delay_ms": 20_000, "match_path": "/v1/chat/completions"}
            assert (await http.post(f"{sim}/sim/faults", json=[fault])).status_code == 200
            await poll_until(
                lambda: http.get(url, headers=admin),
                lambda r: (r.json()["status"]["preempt_channel"] or {}).get("workers_reached") == 1,
                timeout=30,
                what="the dev api reaching the dev worker's channel",
                interval=0.5,
            )
            client = openai.AsyncOpenAI(api_key=DEV_KEY, base_url=f"{api}/v1", max_retries=0)
            f = await client.files.create(file=("in.jsonl", jsonl(SHARED + 6)), purpose="batch")
            b = await client.batches.create(
                input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            await poll_until(
                lambda: http.get(url, headers=admin),
                lambda r: r.json()["status"]["running_lines"] >= SHARED,
                timeout=60,
                what="every shared seat held by a batch line",
                interval=0.5,
            )
            # A live burst of one: it needs a seat, so a batch line is ended.
            live = asyncio.ensure_future(
                client.chat.completions.create(
                    model="demo", messages=[{"role": "user", "content": "live"}]
                )
            )
            try:
                await poll_until(
                    lambda: http.get(url, headers=admin),
                    lambda r: r.json()["status"]["preempted_lines"] >= 1,
                    timeout=15,
                    what="the route's status showing a preempted line",
                    interval=0.2,
                )
            finally:
                live.cancel()
                with contextlib.suppress(asyncio.CancelledError, openai.APIError):
                    await live
                await http.delete(f"{sim}/sim/faults")
                await client.batches.cancel(b.id)
    finally:
        dev.stop(timeout=30)
