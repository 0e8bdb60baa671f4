"""Finalizing and retention on the store: files assembled once (a rerun answers the same),
a finished batch's working data dropped, output expiry honoured, expired files found."""

from __future__ import annotations

from pathlib import Path

import httpx

from activities.finalizing import FinalizeActivities
from activities.retention import RetentionActivities
from tests.unit.test_run_line import BATCH, line, make, run
from workflows.messages import FinalizeInput


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
