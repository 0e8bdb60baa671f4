"""A batch under fire: the worker SIGKILLed three times, the api and the Temporal dev server
(SQLite file) each restarted once. Used by tests/e2e/test_chaos.py (reduced size, in CI) and
bench/chaos.py (full size, on demand)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai

from tests.e2e.stack import (
    TERMINAL,
    Stack,
    output_ids,
    submit,
    wait_in_flight,
    wait_terminal,
)
from tests.polling import poll_until
from tools.dev.devserver import DevServer, free_port
from tools.sim import SimConfig


@dataclass
class ChaosReport:
    lines: int
    seconds: float = 0.0
    status: str = ""
    completed: int = 0
    failed: int = 0
    missing: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    upstream_requests: int = 0
    in_flight_at_kills: list[int] = field(default_factory=list)
    """The batch's requests open at the upstream the moment each worker was killed."""


def _completed(batch: Any) -> int:
    return batch.request_counts.completed if batch.request_counts else 0


async def _wait_progress(
    client: openai.AsyncOpenAI, batch_id: str, at_least: int, within: float
) -> Any:
    """Every restart in this run is awaited (healthy again) before the next poll, so an API
    error here is a real failure, not a restart in progress."""
    return await poll_until(
        lambda: client.batches.retrieve(batch_id),
        lambda b: _completed(b) >= at_least or b.status in TERMINAL,
        timeout=within,
        what=f"batch {batch_id} to complete {at_least} lines",
        interval=0.2,
    )


async def run_chaos(
    tmp: Path,
    lines: int,
    *,
    cap: int = 8,
    latency_ms: float = 10,
    step_timeout: float = 180,
) -> ChaosReport:
    report = ChaosReport(lines=lines)
    server = DevServer(tmp / "temporal", port=free_port(), ui_port=None)
    server.start()
    await server.wait_ready_async(timeout=60)
    stack = Stack(
        tmp, server.address, cap=cap, sim=SimConfig(model_names=[], latency_ms=latency_ms)
    )
    await stack.start()
    client = stack.client()
    t0 = time.monotonic()
    try:
        batch_id = await submit(stack, lines, prefix="chaos")
        steps = [lines * k // 7 for k in range(1, 6)]
        actions = ["kill", "api", "kill", "temporal", "kill"]
        for at, action in zip(steps, actions, strict=True):
            await _wait_progress(client, batch_id, at, within=step_timeout)
            report.events.append(f"{action} at {at} lines, t={time.monotonic() - t0:.1f}s")
            if action == "kill":
                # Kill while lines are open at the upstream (not in a lull between them), so
                # the kill really loses running lines.
                await wait_in_flight(stack, 1, within=step_timeout)
                report.in_flight_at_kills.append(
                    int(stack.sim.app.stats_dict()["batch"]["concurrent"])
                )
                stack.workers[-1].kill()
                stack.start_worker()
            elif action == "api":
                await asyncio.to_thread(stack.api.stop)
                stack.api.start(stack.api.argv, stack.env(), stack.tmp / "api.log")
                await stack.wait_healthy()
            else:
                await asyncio.to_thread(server.stop)
                server.start()
                await server.wait_ready_async(timeout=60)
                await stack.wait_healthy()
            if action != "kill":
                # Back after a restart: the batch answers again (errors only while restarting).
                await poll_until(
                    lambda: client.batches.retrieve(batch_id),
                    timeout=60,
                    what=f"batch {batch_id} readable after the {action} restart",
                    interval=0.5,
                    ignore=(openai.APIError,),
                )
        await wait_terminal(client, batch_id, within=step_timeout * 3)
        report.seconds = time.monotonic() - t0
        batch = await client.batches.retrieve(batch_id)
        report.status = batch.status
        assert batch.request_counts is not None
        report.completed = batch.request_counts.completed
        report.failed = batch.request_counts.failed
        ids, errors = await output_ids(client, batch)
        seen = ids + [str(e["custom_id"]) for e in errors]
        expected = {f"chaos-{i}" for i in range(lines)}
        counts: dict[str, int] = {}
        for cid in seen:
            counts[cid] = counts.get(cid, 0) + 1
        report.missing = sorted(expected - counts.keys())
        report.duplicated = sorted(c for c, n in counts.items() if n > 1)
        stats: dict[str, Any] = stack.sim.app.stats_dict()
        report.upstream_requests = int(stats["batch"]["by_batch"].get(batch_id, 0))
        return report
    finally:
        await stack.stop()
        await asyncio.to_thread(server.stop)
