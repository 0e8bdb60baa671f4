"""Storage outages are waits, not failures (docs/decisions/0047): a batch whose finalizing finds
the file store unavailable (the S3 endpoint down, the local store's disk full) for a minute
waits, tries again, and completes with every line's result once the store is back.

The outage starts exactly between the last line's commit and finalizing: the batch's workflow
runs in a workflows-only worker that is frozen (SIGSTOP) while its lines finish in an
activities-only worker (decision 0016), the outage starts once the store holds every line's
result, and the workflow worker is thawed to schedule finalizing into it. Finalizing gave up
after 5 attempts (~15 s) before: the batch failed, without files.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.stack import (
    TERMINAL,
    Stack,
    input_ids,
    moto_server,
    output_ids,
    submit,
    wait_in_flight,
    wait_terminal,
)
from tests.e2e.test_metrics import scrape, value, worker_url
from tests.polling import poll_until
from tests.tcp_gate import TcpGate
from tools.sim import SimConfig

LINES = 6
OUTAGE_SECONDS = 60.0
"""How long the store stays unavailable once finalizing has failed on it: four times what the
old retry policy waited before failing the batch."""

Outage = Callable[[], Awaitable[object]]


async def finalize_through(stack: Stack, down: Outage, up: Outage) -> None:
    """Run a batch to its last commit, make the store unavailable (`down`), let finalizing fail
    on it, keep it down `OUTAGE_SECONDS`, bring it back (`up`): the batch completes whole."""
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
        await asyncio.sleep(OUTAGE_SECONDS)  # the outage itself, not a wait for a condition
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


async def test_finalizing_waits_out_the_s3_endpoint_down(tmp_path: Path, dev_server: Any) -> None:
    gate = await TcpGate(moto_server().port).open()
    stack = Stack(
        tmp_path, dev_server.address, cap=LINES, sim=SimConfig(model_names=[], latency_ms=2000)
    )
    stack.s3_url = gate.url  # every process reaches moto's server through the gate
    try:
        async with stack.running(workers=0):
            await finalize_through(stack, gate.close, gate.open)
    finally:
        await gate.close()


def _mount_tmpfs(path: Path, size: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs (a disk that fills up) needs root")
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")


def _fill(path: Path) -> None:
    """Write zeros to `path` until the disk is full."""
    chunk = b"\0" * (1 << 20)
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                f.write(chunk)
        except OSError as err:
            if err.errno != errno.ENOSPC:
                raise
    # The last pages too: a write smaller than a chunk may still have found room.
    with open(path, "ab", buffering=0) as f:
        with contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 512)


async def test_finalizing_waits_out_a_full_disk(tmp_path: Path, dev_server: Any) -> None:
    stack = Stack(
        tmp_path, dev_server.address, cap=LINES, sim=SimConfig(model_names=[], latency_ms=2000)
    )
    if stack.s3_url is not None:
        pytest.skip("the local store's disk (this run's store is S3)")
    data = tmp_path / "data"
    _mount_tmpfs(data, "32m")
    filler = data / "filler"
    try:
        async with stack.running(workers=0):

            async def full() -> None:
                await asyncio.to_thread(_fill, filler)

            async def freed() -> None:
                filler.unlink()

            await finalize_through(stack, full, freed)
    finally:
        await asyncio.to_thread(subprocess.run, ["umount", "-l", str(data)], check=False)
