"""A batch whose finalizing finds the file store unavailable for a minute
(tests/e2e/test_store_outage_s3.py, test_store_outage_disk.py; docs/decisions/0047): it waits,
tries again, and completes with every line's result once the store is back.

The outage starts exactly between the last line's commit and finalizing: the batch's workflow
runs in a workflows-only worker that is frozen (SIGSTOP) while its lines finish in an
activities-only worker (decision 0016), the outage starts once the store holds every line's
result, and the workflow worker is thawed to schedule finalizing into it. Finalizing gave up
after 5 attempts (~15 s) before: the batch failed, without files. One module per store, so
the two outages run side by side in `make test` (`--dist loadfile`).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

from tests.e2e.stack import (
    TERMINAL,
    Stack,
    input_ids,
    output_ids,
    submit,
    wait_in_flight,
    wait_terminal,
)
from tests.e2e.test_metrics import scrape, value, worker_url
from tests.polling import poll_until
from tools.sim import SimConfig

LINES = 6
OUTAGE_SECONDS = 60.0
"""How long the S3 store stays unavailable once finalizing has failed on it: four times what the
old retry policy waited before failing the batch."""
SHORT_OUTAGE_SECONDS = 25.0
"""The full disk's outage: longer than the old retry policy's 15 s of attempts (1 + 2 + 4 + 8 s)
before it failed the batch, so the test still fails on it, at less of the suite's time."""

Outage = Callable[[], Awaitable[object]]


async def finalize_through(
    stack: Stack, down: Outage, up: Outage, hold: float = OUTAGE_SECONDS
) -> None:
    """Run a batch to its last commit, make the store unavailable (`down`), let finalizing fail
    on it, keep it down `hold` seconds, bring it back (`up`): the batch completes whole."""
    flows = stack.start_worker({"BACKFILL_WORKER_ROLE": "workflows"})
    stack.start_worker({"BACKFILL_WORKER_ROLE": "activities"})
    await stack.wait_polled()
    client = stack.client()
    batch_id = await submit(stack, LINES, prefix="out")
    await wait_in_flight(stack, LINES)
    flows.send_signal(signal.SIGSTOP)  # no workflow task runs: finalizing is not scheduled
    try:
        store = stack.store()
        await poll_until(
            lambda: asyncio.to_thread(store.keys, f"batches/{batch_id}/results/"),
            lambda keys: len(keys) == LINES,
            timeout=120,
            what=f"every line of {batch_id} committed",
        )
        await down()
    finally:
        flows.send_signal(signal.SIGCONT)

    async with httpx.AsyncClient(timeout=30) as http:

        async def failed_attempts() -> float:
            samples = await scrape(http, worker_url(stack, 1))
            return value(samples, "gateway_store_unavailable_total", step="finalizing") or 0

        async def attempts_and_status() -> tuple[float, str]:
            return await failed_attempts(), (await client.batches.retrieve(batch_id)).status

        first, status = await poll_until(
            attempts_and_status,
            lambda seen: seen[0] >= 1 or seen[1] in TERMINAL,
            timeout=120,
            what="finalizing to fail on the store",
        )
        assert status == "finalizing"
        # The batch says why (once Temporal has the failed attempt the worker counted).
        await poll_until(
            lambda: client.batches.retrieve(batch_id),
            lambda b: (b.model_extra or {})["backfill"]["waiting_on_store"] is True,
            timeout=30,
            what=f"batch {batch_id} to say it waits on the store",
        )
        waiting = value(
            await scrape(http, worker_url(stack, 1)), "gateway_batches_waiting_on_store"
        )
        assert waiting == 1
        await asyncio.sleep(hold)  # the outage itself, not a wait for a condition
        batch = await client.batches.retrieve(batch_id)
        assert batch.status == "finalizing", batch  # waiting, not failed
        assert await failed_attempts() > first  # tried again meanwhile
        await up()
        batch = await wait_terminal(client, batch_id, within=180)
        assert batch.status == "completed", batch
        assert batch.model_extra is not None
        assert batch.model_extra["backfill"]["waiting_on_store"] is False
        ids, errors = await output_ids(client, batch)
        assert ids == input_ids("out", LINES) and errors == []
        assert batch.request_counts is not None and batch.request_counts.completed == LINES
        assert await asyncio.to_thread(store.keys, f"batches/{batch_id}/") == [
            f"batches/{batch_id}/finalized.json"
        ]
        samples = await scrape(http, worker_url(stack, 1))
        assert value(samples, "gateway_batches_waiting_on_store") == 0


def outage_stack(tmp: Path, temporal_address: str) -> Stack:
    """A stack whose lines are held 2 s at the simulator, all at once (started with no worker:
    `finalize_through` starts its own)."""
    return Stack(tmp, temporal_address, cap=LINES, sim=SimConfig(model_names=[], latency_ms=2000))
