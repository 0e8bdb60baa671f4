"""A line's own work as a bare activity, for the throughput bench's `bare-work` phase.

Kept out of `bench/bare_workflow.py`: the workflow sandbox must not import httpx.
"""

from __future__ import annotations

import asyncio
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from temporalio import activity


class LineWork:
    """A line's unavoidable work without backfill around it: one `pread` of the line from the
    input file (offsets kept in memory), its body POSTed to the model server with the same HTTP
    client as the worker's, and the answer committed the way any durable gateway must (a temp
    file written and fsynced, linked into place first-writer-wins, its directory fsynced; the
    store's `commit_result`). File I/O runs in a thread pool of the same size as a worker's.
    The workflow schedules it with a line's heartbeat timeout (a line answered within half of
    it sends no heartbeat, in backfill either)."""

    def __init__(self, input_path: Path, url: str, http: httpx.AsyncClient, store: Any) -> None:
        data = input_path.read_bytes()
        self._offsets: list[tuple[int, int]] = []
        pos = 0
        for line in data.split(b"\n"):
            if line:
                self._offsets.append((pos, len(line)))
            pos += len(line) + 1
        self._input = open(input_path, "rb")  # noqa: SIM115 - closed by close()
        self._url = url
        self._http = http
        self._store = store
        self._io = ThreadPoolExecutor(32, thread_name_prefix="line-store")

    def close(self) -> None:
        self._io.shutdown()
        self._input.close()

    def _read(self, i: int) -> bytes:
        off, n = self._offsets[i]
        return os.pread(self._input.fileno(), n, off)

    @activity.defn(name="line_work")
    async def line_work(self, i: int) -> int:
        loop = asyncio.get_running_loop()
        raw = await loop.run_in_executor(self._io, self._read, i)
        line = json.loads(raw)
        resp = await self._http.post(self._url, content=json.dumps(line["body"]).encode())
        record = b'{"custom_id":%s,"response":{"status_code":%d,"body":%s}}' % (
            json.dumps(line["custom_id"]).encode(),
            resp.status_code,
            resp.content,
        )
        await loop.run_in_executor(self._io, self._store.commit_result, BARE_BATCH, i, record)
        return i


BARE_BATCH = "batch_" + "0" * 28
"""The directory `LineWork` commits its records under (a well-formed batch id)."""
