"""The start of a file or of a committed record, read without the rest (a job's view reads its
record this way: issue 47), on every store: the local directory and S3 (moto on loopback)."""

from __future__ import annotations

from pathlib import Path

import pytest

from backfill.files import FileStore, Store
from tests.stores import upload

STORES = ["local", "s3"]


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "local":
        return FileStore(tmp_path / "store")
    return request.getfixturevalue("s3")  # type: ignore[no-any-return]


def test_a_files_head_is_its_first_bytes_and_no_more(store: Store) -> None:
    data = b"x" * 5000 + b"\n"
    file_id = upload(store, data)
    for size in (0, 1, 100, len(data), len(data) + 10):
        assert store.read_file_head(file_id, size) == data[:size], size
    assert store.read_file_head(upload(store, b""), 10) == b""
    with pytest.raises(FileNotFoundError):
        store.read_file_head("file-missing", 10)


def test_a_records_head_is_its_first_bytes_and_no_more(store: Store) -> None:
    record = b'{"id":"r","response":{"status_code":200,"body":"' + b"y" * 5000 + b'"}}'
    store.commit_result("batch_heads", 3, record)
    for size in (1, 64, len(record), len(record) + 10):
        assert store.get_result_head("batch_heads", 3, size) == record[:size], size
    assert store.get_result_head("batch_heads", 4, 64) is None
