"""The input is read once at create (issue 49): its line count and its first request line come
from one pass (`api.batches.input_scan`), and a create opens the input once."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, BinaryIO, cast

import pytest
from temporalio.client import Client

from api.batches.batches_api import create_batch
from api.batches.input_scan import scan_input
from api.deps import Identity
from api.schemas import CreateBatch
from backfill.files import FileStore
from backfill.files.base import CHUNK_BYTES
from backfill.platform.config import Settings
from backfill.platform.messages import BatchInput
from backfill.tenancy.admission import ReserveRequest, ReserveResult


class CountingStore(FileStore):
    """The local store, counting the times each uploaded file is opened for reading."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.opened: dict[str, int] = {}

    def open_file(self, file_id: str) -> BinaryIO:
        self.opened[file_id] = self.opened.get(file_id, 0) + 1
        return super().open_file(file_id)


class StandInTemporal:
    """Admits every batch and records the workflows started (no history: the estimate asks no
    scheduler)."""

    def __init__(self) -> None:
        self.reserved: list[ReserveRequest] = []
        self.started: list[BatchInput] = []

    async def execute_update_with_start_workflow(
        self, update: Any, req: ReserveRequest, **_: Any
    ) -> ReserveResult:
        self.reserved.append(req)
        return ReserveResult(accepted=True, active=1, lines=req.lines)

    async def start_workflow(self, run: Any, inp: BatchInput, **_: Any) -> None:
        self.started.append(inp)


def _upload(store: FileStore, data: bytes) -> str:
    up = store.begin_upload(len(data) + 1)
    up.write(data)
    return up.finish(workspace="w", filename="in.jsonl", purpose="batch").id


def _line(i: int, model: str = "demo") -> bytes:
    body = {"model": model, "messages": [{"role": "user", "content": "x" * 200}]}
    line = {"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
    return json.dumps(line).encode() + b"\n"


@pytest.mark.parametrize(
    ("data", "lines"),
    [(b"", 0), (b"a\n", 1), (b"a\nb", 2), (b"\n\na\n", 3), (b"a\r\nb\r\n", 2)],
)
def test_the_scan_counts_lines_as_before(tmp_path: Path, data: bytes, lines: int) -> None:
    store = FileStore(tmp_path)
    assert scan_input(store, _upload(store, data)).lines == lines


def test_the_scan_keeps_only_the_beginning_of_a_long_input(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    data = _line(0) + b"".join(_line(i, "other") for i in range(1, 20_000))  # ~6 MB
    scan = scan_input(store, _upload(store, data))
    assert scan.lines == 20_000
    assert scan.head.startswith(_line(0)) and len(scan.head) <= CHUNK_BYTES


def test_a_create_reads_its_input_once(tmp_path: Path) -> None:
    """One open of the input per create, and from it both the count (admission, estimate) and
    the first line's model (estimate)."""
    settings = Settings(
        data_dir=tmp_path,
        models=[{"id": "demo", "routes": [{"id": "r1", "base_url": "http://upstream/v1"}]}],
    )
    store = CountingStore(tmp_path)
    file_id = _upload(store, b"".join(_line(i) for i in range(3)))
    temporal = StandInTemporal()
    req = CreateBatch(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    who = Identity(workspace="w", role="member", key_name="k")
    asyncio.run(create_batch(req, settings, cast(Client, temporal), store, who))
    assert store.opened == {file_id: 1}
    assert [r.lines for r in temporal.reserved] == [3]
    (started,) = temporal.started
    assert started.estimate is not None
    assert (started.estimate.lines, started.estimate.model) == (3, "demo")
