"""The file store: permissions, streaming cap, first-writer-wins results, pinned inputs."""

from __future__ import annotations

import os
import stat
from array import array
from pathlib import Path

import pytest

from backfill.store import FileStore, FileTooLarge, RouteLines


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def upload(store: FileStore, data: bytes, cap: int = 1 << 20) -> str:
    up = store.begin_upload(cap)
    up.write(data)
    return up.finish(workspace="w", filename="in.jsonl", purpose="batch").id


def test_files_are_0600_and_directories_0750(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "s")
    file_id = upload(store, b'{"a":1}\n')
    assert mode(store.root / "files" / f"{file_id}.data") == 0o600
    assert mode(tmp_path / "s" / "files" / f"{file_id}.json") == 0o600
    for d in (tmp_path / "s", tmp_path / "s" / "files", tmp_path / "s" / "batches"):
        assert mode(d) == 0o750
    store.commit_result("batch_abc", 3, b"{}")
    result = tmp_path / "s" / "batches" / "batch_abc" / "results" / "00000" / "3.json"
    assert mode(result) == 0o600 and mode(result.parent) == 0o750


def test_upload_cap_is_enforced_while_streaming(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    up = store.begin_upload(10)
    up.write(b"x" * 10)
    with pytest.raises(FileTooLarge):
        up.write(b"y")
    up.abort()
    assert list((tmp_path / "files").iterdir()) == []


def test_first_result_wins(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    assert store.commit_result("batch_x", 0, b"first") == (b"first", True)
    assert store.commit_result("batch_x", 0, b"second") == (b"first", False)
    assert store.get_result("batch_x", 0) == b"first"
    assert store.get_result("batch_x", 1) is None
    leftovers = [p for p in (tmp_path / "batches").rglob(".tmp-*")]
    assert leftovers == []


def test_index_and_pinned_input_survive_deleting_the_upload(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    data = b'{"custom_id":"a"}\n{"custom_id":"b"}\n'
    file_id = upload(store, data)
    store.snapshot_input("batch_y", file_id)
    store.write_index(
        "batch_y",
        array("Q", [0, 18]),
        array("I", [17, 17]),
        [RouteLines("r", "m", 2)],
        [array("I", [0, 1])],
    )
    assert store.delete_file(file_id)
    assert store.get_file(file_id) is None
    assert store.read_line("batch_y", file_id, 1) == b'{"custom_id":"b"}'
    assert store.line_number("batch_y", 0, 1) == 1
    assert [raw for _, raw in store.iter_lines("batch_y", file_id)] == data.split(b"\n")[:2]


def test_ids_outside_the_store_are_refused(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    assert store.get_file("../../etc/passwd") is None
    with pytest.raises(KeyError):
        store.commit_result("../x", 0, b"")


def test_every_directory_level_the_store_creates_is_0750_whatever_the_umask(
    tmp_path: Path,
) -> None:
    old = os.umask(0o002)  # a umask that would leave new directories group-writable (0775)
    try:
        store = FileStore(tmp_path / "a" / "b" / "root")
        store.commit_result("batch_abc", 12345, b"{}")
    finally:
        os.umask(old)
    levels = [tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "root"]
    batch = tmp_path / "a" / "b" / "root" / "batches" / "batch_abc"
    levels += [batch, batch / "results", batch / "results" / "00012"]
    assert {str(p): oct(mode(p)) for p in levels} == {str(p): oct(0o750) for p in levels}


def test_a_committed_result_and_a_published_file_are_durable_in_their_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileStore(tmp_path)
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    store.commit_result("batch_abc", 3, b"{}")
    assert str(tmp_path / "batches" / "batch_abc" / "results" / "00000") in synced
    synced.clear()
    upload(store, b"x\n")
    assert str(tmp_path / "files") in synced
    synced.clear()
    store.commit_result("batch_abc", 3, b"{}")  # lost the race: nothing new to make durable
    assert synced == []


def _indexed(store: FileStore, batch_id: str, lines: list[bytes]) -> str:
    """A batch whose index and pinned input are written, as validation leaves them."""
    file_id = upload(store, b"".join(line + b"\n" for line in lines))
    store.snapshot_input(batch_id, file_id)
    offsets, lengths, pos = array("Q"), array("I"), 0
    for line in lines:
        offsets.append(pos)
        lengths.append(len(line))
        pos += len(line) + 1
    nums = array("I", reversed(range(len(lines))))  # the route lists them backwards
    store.write_index(batch_id, offsets, lengths, [RouteLines("r", "m", len(lines))], [nums])
    return file_id


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_lines_are_read_through_a_bounded_set_of_kept_handles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("backfill.store.local.READ_HANDLES", 6)
    store = FileStore(tmp_path)
    before = open_fds()
    batches = {}
    for b in range(5):  # 4 files a batch: 20 handles asked for, 6 kept
        batch_id = f"batch_b{b}"
        lines = [b'{"custom_id":"%d-%d"}' % (b, i) for i in range(3)]
        batches[batch_id] = file_id = _indexed(store, batch_id, lines)
        for position in range(3):
            line_no = store.line_number(batch_id, 0, position)
            assert line_no == 2 - position
            assert store.read_line(batch_id, file_id, line_no) == lines[line_no]
        assert open_fds() - before <= 6
    # the first batch's handles were let go; its lines are read again all the same
    assert store.read_line("batch_b0", batches["batch_b0"], 1) == b'{"custom_id":"0-1"}'
    assert open_fds() - before <= 6


def test_a_dropped_batch_reads_no_lines_even_through_kept_handles(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    file_id = _indexed(store, "batch_d", [b'{"custom_id":"a"}'])
    assert store.read_line("batch_d", file_id, store.line_number("batch_d", 0, 0))
    store.drop_batch_work("batch_d")
    with pytest.raises(FileNotFoundError):
        store.line_number("batch_d", 0, 0)
