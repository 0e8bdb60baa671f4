"""The simulator's fault injection as docs/cli.md tells a user to drive it (issue 39: it was
documented nowhere): the page's `curl` lines, run against a real simulator, add the fault (the
next request answers its status) and clear it."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx

from tools.sim import SimConfig, SimServer

ROOT = Path(__file__).resolve().parents[2]


def curl_lines() -> list[str]:
    text = (ROOT / "docs/cli.md").read_text()
    block = re.search(
        r"```sh\n(curl -s -X POST http://127\.0\.0\.1:8100/sim/faults.*?)```", text, re.S
    )
    assert block, "docs/cli.md no longer shows /sim/faults"
    joined = block.group(1).replace("\\\n", " ")
    return [line.split("#")[0].strip() for line in joined.splitlines() if line.startswith("curl")]


async def run(command: str) -> str:
    proc = await asyncio.create_subprocess_shell(
        command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await proc.communicate()
    assert proc.returncode == 0, out
    return out.decode()


async def test_the_documented_fault_commands_work() -> None:
    add, clear = curl_lines()
    sim = SimServer(SimConfig(model_names=["demo"], latency_ms=1))
    await sim.start()
    try:
        base = sim.url
        out = await run(
            add.replace("http://127.0.0.1:8100", base).replace('"rate": 0.05', '"rate": 1')
        )
        assert '"status":500' in out.replace(" ", ""), out
        body = {"model": "demo", "messages": [{"role": "user", "content": "x"}]}
        async with httpx.AsyncClient(base_url=base, trust_env=False) as http:
            assert (await http.post("/v1/chat/completions", json=body)).status_code == 500
            await run(clear.replace("http://127.0.0.1:8100", base))
            assert (await http.post("/v1/chat/completions", json=body)).status_code == 200
    finally:
        await sim.stop()
