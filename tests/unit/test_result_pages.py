"""Partial results, round three (issue 40): a page of a finished batch is read from its cursor
(the sparse index finalizing keeps), not from the file's start; any malformed cursor and any
cursor no page could have given are a 400, never a 500 or an empty page."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import pytest

from activities import finalizing
from activities.finalizing import FinalizeActivities
from api.batches.results import Cursor, read_page
from api.errors import InvalidRequest
from backfill.files import FileStore
from backfill.platform.messages import FinalizeInput
from tests.unit.test_partial_results import BATCH, commit, fetch, file_records, prepared


@pytest.fixture(autouse=True)
def _no_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "fsync", lambda fd: None)


@pytest.mark.parametrize(
    "text", ["²", "²." + "1", "1.²", "٣.1", "1" * 5000 + ".0", "0." + "9" * 5000, "1 .2", "+1.2"]
)
def test_any_malformed_cursor_is_a_400(text: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        Cursor.parse(text)
    assert err.value.param == "after" and len(err.value.message) < 200


class _Counted(io.RawIOBase):
    """A file whose reads are counted (bytes handed out)."""

    def __init__(self, f: Any, tally: list[int]) -> None:
        self.f, self.tally = f, tally

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        return int(self.f.seek(offset, whence))

    def readinto(self, b: Any) -> int:
        n = int(self.f.readinto(b))
        self.tally[0] += n
        return n

    def close(self) -> None:
        self.f.close()
        super().close()


class _CountingStore(FileStore):
    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.read = [0]

    def open_file(self, file_id: str) -> Any:
        return io.BufferedReader(_Counted(super().open_file(file_id), self.read), 4096)


def _finished(tmp_path: Path, n: int, statuses: Any) -> tuple[_CountingStore, Any]:
    store, file_id = prepared(tmp_path, n)
    counting = _CountingStore(tmp_path)
    for i in range(n):
        commit(counting, i, statuses(i))
    out = FinalizeActivities(counting)._finalize(
        FinalizeInput(batch_id=BATCH, workspace="w", input_file_id=file_id, reason="expired")
    )
    return counting, out


def test_a_late_page_reads_from_its_cursor_not_from_the_start(tmp_path: Path) -> None:
    n = 3000
    store, out = _finished(tmp_path, n, lambda i: 200)
    whole = len(store.read_file(out.output_file_id))
    per_record = whole / n
    store.read[0] = 0
    data, cursor, has_more = fetch(store, Cursor(2900, 0), 10)
    assert [d["record"]["custom_id"] for d in data] == [f"c{i}" for i in range(2900, 2910)]
    assert cursor == Cursor(2910, 0) and has_more
    # At most a stride (256 records) before the page, plus the page and read buffers.
    assert store.read[0] < (256 + 10) * per_record + 2 * 4096, (store.read[0], whole)


def test_pages_through_the_index_are_the_files_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stride of 3 so every way a cursor falls against the index is met, in both files."""
    monkeypatch.setattr(finalizing, "RECORD_STRIDE", 3)
    store, out = _finished(tmp_path, 40, lambda i: 200 if i % 3 else 500)
    for limit in (1, 2, 3, 4, 7):
        got: list[dict[str, Any]] = []
        cursor, has_more = Cursor(), True
        while has_more:
            page, cursor, has_more = fetch(store, cursor, limit)
            got += page
        assert [d["record"] for d in got if d["file"] == "output"] == file_records(
            store, out.output_file_id
        )
        assert [d["record"] for d in got if d["file"] == "error"] == file_records(
            store, out.error_file_id
        )


def test_an_impossible_cursor_is_a_400(tmp_path: Path) -> None:
    store, file_id = prepared(tmp_path, 6)
    commit(store, 0, 200)
    with pytest.raises(InvalidRequest, match="6 lines"):
        read_page(store, BATCH, Cursor(4, 3), 10)  # 7 records of a 6-line batch
    assert read_page(store, BATCH, Cursor(4, 2), 10)[0].items == []  # possible: nothing new yet
    for i in range(1, 6):
        commit(store, i, 200 if i < 4 else 400)
    FinalizeActivities(store)._finalize(
        FinalizeInput(batch_id=BATCH, workspace="w", input_file_id=file_id, reason="expired")
    )
    with pytest.raises(InvalidRequest, match="4 output and 2 error"):
        read_page(store, BATCH, Cursor(5, 0), 10)
    with pytest.raises(InvalidRequest):
        read_page(store, BATCH, Cursor(0, 3), 10)
    page, has_more = read_page(store, BATCH, Cursor(4, 2), 10)
    assert page.items == [] and not has_more
