"""The local store's own guarantees: file modes whatever the umask, durable commits (fsynced
directories), lines read through a bounded set of kept handles. What every store does is in
test_store_contract.py."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from backfill.files import BatchFinalized, FileStore
from tests.stores import indexed_batch, upload


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


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


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_lines_are_read_through_a_bounded_set_of_kept_handles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("backfill.files.local.READ_HANDLES", 6)
    store = FileStore(tmp_path)
    before = open_fds()
    batches = {}
    for b in range(5):  # 4 files a batch: 20 handles asked for, 6 kept
        batch_id = f"batch_b{b}"
        lines = [b'{"custom_id":"%d-%d"}' % (b, i) for i in range(3)]
        batches[batch_id] = file_id = indexed_batch(store, batch_id, lines)
        for position in range(3):
            line_no = store.line_number(batch_id, 0, position)
            assert line_no == 2 - position
            assert store.read_line(batch_id, file_id, line_no) == lines[line_no]
        assert open_fds() - before <= 6
    # the first batch's handles were let go; its lines are read again all the same
    assert store.read_line("batch_b0", batches["batch_b0"], 1) == b'{"custom_id":"0-1"}'
    assert open_fds() - before <= 6


def test_a_deletion_is_durable_metadata_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The metadata's unlink reaches the disk before the content's goes (a crash between never
    keeps a file whose content is gone), and the content's before `delete_file` returns; then
    the file's entry in its workspace's index goes (an entry without a file is passed over)."""
    store = FileStore(tmp_path)
    file_id = upload(store, b"x\n")
    events: list[tuple[str, str]] = []
    real_fsync, real_unlink = os.fsync, os.unlink

    def fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def unlink(path: str | os.PathLike[str], **kw: object) -> None:
        events.append(("unlink", os.path.basename(path)))
        real_unlink(path, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "unlink", unlink)
    assert store.delete_file(file_id)
    files = str(tmp_path / "files")
    assert events == [
        ("unlink", f"{file_id}.json"),
        ("fsync", files),
        ("unlink", f"{file_id}.data"),
        ("fsync", files),
        ("unlink", file_id),
        ("fsync", str(tmp_path / "workspaces" / "w" / "files")),
    ]


def test_a_finalized_batch_refuses_a_late_line_even_when_finalizing_races_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileStore(tmp_path)
    work = tmp_path / "batches" / "batch_late"
    store.commit_result("batch_late", 0, b"ran")
    store.write_finalized("batch_late", b"{}")
    store.drop_batch_work("batch_late")
    with pytest.raises(BatchFinalized):
        store.commit_result("batch_late", 1, b"zombie")
    assert sorted(p.name for p in work.iterdir()) == ["finalized.json"]

    # Finalizing writes its record and drops the work after the line's first look, before
    # its link: the look after the link undoes it, and the directories it made.
    store.commit_result("batch_race", 0, b"ran")
    real_link = os.link

    def link(src: str, dst: Path) -> None:
        if str(dst).endswith("/5.json"):
            store.write_finalized("batch_race", b"{}")
            store.drop_batch_work("batch_race")
            os.makedirs(os.path.dirname(dst), exist_ok=True)  # the line's own mkdir, again
        real_link(src, dst)

    monkeypatch.setattr(os, "link", link)
    with pytest.raises(BatchFinalized):
        store.commit_result("batch_race", 5, b"zombie")
    assert store.keys("batches/batch_race/") == ["batches/batch_race/finalized.json"]
