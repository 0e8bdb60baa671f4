"""Finalizing and retention on the store: files assembled once (a rerun answers the same),
a finished batch's working data dropped, output expiry honoured, expired files found."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from activities.finalizing import FinalizeActivities
from activities.retention import RetentionActivities
from backfill.platform.messages import FinalizeInput
from tests.unit.test_run_line import BATCH, line, make, run


def test_a_finished_batch_keeps_only_its_outputs_and_a_rerun_answers_the_same(
    tmp_path: Path,
) -> None:
    acts, file_id, store = make(tmp_path, lambda r: httpx.Response(200, json={"id": "x"}))
    for pos in range(2):
        run(acts, line(file_id, position=pos))
    fin = FinalizeActivities(store)
    inp = FinalizeInput(
        batch_id=BATCH,
        workspace="w",
        input_file_id=file_id,
        reason="expired",
        output_expires_after_seconds=7200,
    )
    first = fin._finalize(inp)
    assert (first.completed, first.failed) == (2, 1)
    work = tmp_path / "batches" / BATCH
    assert [p.name for p in work.iterdir()] == ["finalized.json"]
    assert fin._finalize(inp) == first  # the per-line results are gone: answered from the record
    out = store.get_file(first.output_file_id or "")
    assert out is not None and out.expires_at == out.created_at + 7200
    assert store.get_file(file_id) is not None  # the upload itself is the user's to delete


def test_expired_files_are_deleted_and_others_kept(tmp_path: Path) -> None:
    acts, file_id, store = make(tmp_path, lambda r: httpx.Response(200, json={}))
    up = store.begin_upload(1 << 10)
    up.write(b"x\n")
    short = up.finish(workspace="w", filename="s", purpose="batch", now=1000, expires_after=3600)
    assert short.expires_at == 4600
    assert [f.id for f in store.expired_files(4599)] == []
    assert [f.id for f in store.expired_files(4600)] == [short.id]
    out = RetentionActivities(store)._delete_expired(4600)
    assert out.deleted_files == 1 and store.get_file(short.id) is None
    assert store.get_file(file_id) is not None


@pytest.mark.scale  # a memory bound: the size is the subject
def test_finalizing_streams_its_files_in_bounded_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """5,000 results of 2 KB (10 MB of output): finalizing holds one record at a time and the
    index (12 bytes a line), never the output, so Python's peak stays far below it."""
    import json
    import os
    import tracemalloc

    from backfill.batches.input_rules import validate_input
    from backfill.files import FileStore
    from backfill.platform.config import Limits, Settings

    monkeypatch.setattr(os, "fsync", lambda fd: None)  # memory is measured here, not the disk
    n = 5_000
    settings = Settings(
        models=[{"id": "demo", "routes": [{"id": "r1", "base_url": "http://upstream/v1"}]}],
        limits=Limits(max_lines_per_batch=n),
    )
    store = FileStore(tmp_path)
    up = store.begin_upload(1 << 30)
    for i in range(n):
        req = {"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions"}
        req["body"] = {"model": "demo", "messages": [{"role": "user", "content": "hi"}]}
        up.write(json.dumps(req).encode() + b"\n")
    file_id = up.finish(workspace="w", filename="in.jsonl", purpose="batch").id
    store.snapshot_input(BATCH, file_id)
    with store.open_input(BATCH, file_id) as f:
        index = validate_input(
            f, batch_id=BATCH, endpoint="/v1/chat/completions", settings=settings
        )
    assert index.errors == []
    store.write_index(BATCH, index.offsets, index.lengths, index.routes, index.route_line_numbers)
    for i in range(n):
        status = 200 if i % 4 else 400  # a quarter go to the error file
        record = {
            "id": f"batch_req_{i}",
            "custom_id": f"c{i}",
            "response": {"status_code": status, "request_id": "r", "body": {"pad": "x" * 2000}},
            "error": None,
        }
        store.commit_result(BATCH, i, json.dumps(record).encode())
    inp = FinalizeInput(batch_id=BATCH, workspace="w", input_file_id=file_id, reason="completed")
    tracemalloc.start()
    try:
        out = FinalizeActivities(store)._finalize(inp)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (out.total, out.completed, out.failed) == (n, n - n // 4, n // 4)
    ok = store.get_file(out.output_file_id or "")
    assert ok is not None and ok.bytes > 7_000_000
    # Alone this peaks at ~0.14 MiB; tracemalloc also counts other threads of the test process
    # (3.8 MiB once in CI's random order). Keeping the 10 MB of records would exceed 5 MiB.
    assert peak < 5 * 2**20, f"peak {peak / 2**20:.1f} MiB"
