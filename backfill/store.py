"""The file store: uploads, batch line indexes, per-line result records, assembled outputs.

The default is a local directory (one host, or several hosts on a shared volume). Files are
written 0600 and every directory level the store creates 0750, whatever the umask. Writes are
atomic (temp file + rename or link) and durable (the file, then its directory, is fsynced), so a
crash never leaves half a file behind nor loses a commit the caller was told about. Per-line
results are committed first-writer-wins: a line that ran twice (a worker died after writing)
keeps its first record, so it is committed exactly once.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from backfill.ids import is_batch_id, is_file_id, new_file_id

FILE_MODE = 0o600
DIR_MODE = 0o750


class FileTooLarge(Exception):
    """An upload went past the configured size cap while streaming."""


class FileObject(BaseModel):
    """Stored metadata of an uploaded or generated file (OpenAI's File object plus owner)."""

    id: str
    bytes: int
    created_at: int
    filename: str
    purpose: str
    workspace: str
    object: str = "file"
    status: str = "processed"
    expires_at: int | None = None
    status_details: str | None = None

    def public(self) -> dict[str, Any]:
        return self.model_dump(exclude={"workspace"})


@dataclass(frozen=True)
class RouteLines:
    """The lines of one batch that go to one route, in order."""

    route_id: str
    model: str
    count: int


class FileStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._files = self.root / "files"
        self._batches = self.root / "batches"
        for d in (self.root, self._files, self._batches):
            _mkdir(d)

    # ---- files ------------------------------------------------------------------------------
    def _data_path(self, file_id: str) -> Path:
        if not is_file_id(file_id):
            raise KeyError(file_id)
        return self._files / f"{file_id}.data"

    def _meta_path(self, file_id: str) -> Path:
        if not is_file_id(file_id):
            raise KeyError(file_id)
        return self._files / f"{file_id}.json"

    def begin_upload(self, max_bytes: int) -> Upload:
        return Upload(self, max_bytes)

    def write_file(
        self,
        *,
        workspace: str,
        filename: str,
        purpose: str,
        data_path: Path,
        size: int,
        now: int,
        file_id: str | None = None,
        expires_at: int | None = None,
    ) -> FileObject:
        """Publish a finished temp file (in this store's directory) as a file object.

        With `file_id` given, an existing file of that id is replaced (idempotent outputs)."""
        obj = FileObject(
            id=file_id or new_file_id(),
            bytes=size,
            created_at=now,
            filename=filename,
            purpose=purpose,
            workspace=workspace,
            expires_at=expires_at,
        )
        os.chmod(data_path, FILE_MODE)
        os.replace(data_path, self._data_path(obj.id))
        _fsync_dir(self._files)
        _atomic_write(self._meta_path(obj.id), obj.model_dump_json().encode())
        return obj

    def get_file(self, file_id: str) -> FileObject | None:
        try:
            return FileObject.model_validate_json(self._meta_path(file_id).read_bytes())
        except (KeyError, FileNotFoundError):
            return None

    def list_files(self, workspace: str | None) -> list[FileObject]:
        out = []
        for p in self._files.glob("*.json"):
            try:
                obj = FileObject.model_validate_json(p.read_bytes())
            except (FileNotFoundError, ValueError):
                continue
            if workspace is None or obj.workspace == workspace:
                out.append(obj)
        return out

    def expired_files(self, now: int) -> list[FileObject]:
        """Files whose `expires_at` has passed."""
        return [
            f for f in self.list_files(None) if f.expires_at is not None and f.expires_at <= now
        ]

    def content_path(self, file_id: str) -> Path:
        return self._data_path(file_id)

    def delete_file(self, file_id: str) -> bool:
        try:
            self._meta_path(file_id).unlink()
        except (KeyError, FileNotFoundError):
            return False
        self._data_path(file_id).unlink(missing_ok=True)
        return True

    def temp_path(self) -> Path:
        fd, name = tempfile.mkstemp(dir=self._files, prefix=".tmp-")
        os.close(fd)
        return Path(name)

    # ---- batches: line index ------------------------------------------------------------------
    def _batch_dir(self, batch_id: str) -> Path:
        if not is_batch_id(batch_id):
            raise KeyError(batch_id)
        return self._batches / batch_id

    def write_index(
        self,
        batch_id: str,
        offsets: array,
        lengths: array,
        routes: list[RouteLines],
        route_line_numbers: list[array],
    ) -> None:
        """Write the compact line index: byte offset and length per line, lines per route."""
        d = self._batch_dir(batch_id)
        _mkdir(d)
        _atomic_write(d / "offsets.bin", offsets.tobytes())
        _atomic_write(d / "lengths.bin", lengths.tobytes())
        for i, nums in enumerate(route_line_numbers):
            _atomic_write(d / f"route-{i}.bin", nums.tobytes())
        meta = {"total": len(offsets), "routes": [r.__dict__ for r in routes]}
        _atomic_write(d / "index.json", json.dumps(meta).encode())

    def snapshot_input(self, batch_id: str, file_id: str) -> None:
        """Pin the batch's input: a hard link in the batch's directory, so deleting the
        uploaded file (the user's right) never pulls the lines from under a running batch."""
        d = self._batch_dir(batch_id)
        _mkdir(d)
        target = d / "input.jsonl"
        if not target.exists():
            os.link(self._data_path(file_id), target)
            _fsync_dir(d)

    def batch_input_path(self, batch_id: str, file_id: str) -> Path:
        """The batch's pinned input (falls back to the uploaded file for older batches)."""
        pinned = self._batch_dir(batch_id) / "input.jsonl"
        return pinned if pinned.exists() else self._data_path(file_id)

    def line_number(self, batch_id: str, route_index: int, position: int) -> int:
        """The input line number at `position` in a route's list of lines."""
        return _read_int(self._batch_dir(batch_id) / f"route-{route_index}.bin", position, "I")

    def read_line(self, batch_id: str, input_file_id: str, line_no: int) -> bytes:
        d = self._batch_dir(batch_id)
        offset = _read_int(d / "offsets.bin", line_no, "Q")
        length = _read_int(d / "lengths.bin", line_no, "I")
        with open(self.batch_input_path(batch_id, input_file_id), "rb") as f:
            f.seek(offset)
            return f.read(length)

    def index_total(self, batch_id: str) -> int:
        meta = json.loads((self._batch_dir(batch_id) / "index.json").read_bytes())
        return int(meta["total"])

    def iter_lines(self, batch_id: str, input_file_id: str) -> Iterator[tuple[int, bytes]]:
        """Every input line in order, by the index (used when assembling outputs)."""
        d = self._batch_dir(batch_id)
        offsets = array("Q")
        offsets.frombytes((d / "offsets.bin").read_bytes())
        lengths = array("I")
        lengths.frombytes((d / "lengths.bin").read_bytes())
        with open(self.batch_input_path(batch_id, input_file_id), "rb") as f:
            for i, (off, ln) in enumerate(zip(offsets, lengths, strict=True)):
                f.seek(off)
                yield i, f.read(ln)

    # ---- batches: the end --------------------------------------------------------------------
    def read_finalized(self, batch_id: str) -> bytes | None:
        """What finalizing recorded when it published the batch's files (None: not yet)."""
        try:
            return (self._batch_dir(batch_id) / "finalized.json").read_bytes()
        except FileNotFoundError:
            return None

    def write_finalized(self, batch_id: str, summary: bytes) -> None:
        d = self._batch_dir(batch_id)
        _mkdir(d)
        _atomic_write(d / "finalized.json", summary)

    def drop_batch_work(self, batch_id: str) -> None:
        """Remove what only a running batch needs (its pinned input, line index and per-line
        results), keeping the `finalized` record. Safe to repeat."""
        d = self._batch_dir(batch_id)
        if not d.exists():
            return
        for entry in d.iterdir():
            if entry.name == "finalized.json":
                continue
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
        _fsync_dir(d)

    # ---- batches: per-line results --------------------------------------------------------------
    def _result_path(self, batch_id: str, line_no: int) -> Path:
        return self._batch_dir(batch_id) / "results" / f"{line_no // 1000:05d}" / f"{line_no}.json"

    def commit_result(self, batch_id: str, line_no: int, record: bytes) -> tuple[bytes, bool]:
        """Commit a line's result record, first writer wins.

        Returns (the committed record, True if this call committed it)."""
        path = self._result_path(batch_id, line_no)
        _mkdir(path.parent)
        tmp = _write_temp(path.parent, record)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return path.read_bytes(), False
        finally:
            os.unlink(tmp)
        _fsync_dir(path.parent)
        return record, True

    def get_result(self, batch_id: str, line_no: int) -> bytes | None:
        try:
            return self._result_path(batch_id, line_no).read_bytes()
        except FileNotFoundError:
            return None


class Upload:
    """A streaming upload into the store: write chunks, the cap enforced as they arrive."""

    def __init__(self, store: FileStore, max_bytes: int) -> None:
        self.store = store
        self.max_bytes = max_bytes
        self.size = 0
        self.path = store.temp_path()
        self._f = open(self.path, "wb")  # noqa: SIM115 - closed in finish/abort

    def write(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.max_bytes:
            raise FileTooLarge(self.size)
        self._f.write(chunk)

    def finish(
        self,
        *,
        workspace: str,
        filename: str,
        purpose: str,
        now: int | None = None,
        file_id: str | None = None,
        expires_after: int | None = None,
    ) -> FileObject:
        """Publish the upload; it expires `expires_after` seconds after `now` (None: never)."""
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
        now = int(time.time()) if now is None else now
        return self.store.write_file(
            workspace=workspace,
            filename=filename,
            purpose=purpose,
            data_path=self.path,
            size=self.size,
            now=now,
            file_id=file_id,
            expires_at=None if expires_after is None else now + expires_after,
        )

    def abort(self) -> None:
        if not self._f.closed:
            self._f.close()
        self.path.unlink(missing_ok=True)


def _mkdir(d: Path) -> None:
    """Create `d` and every missing parent 0750 (mkdir's `mode` applies to the last level only,
    and the umask trims it): existing directories are left as they are."""
    missing = []
    p = d
    while not p.exists():
        missing.append(p)
        p = p.parent
    for level in reversed(missing):
        try:
            level.mkdir()
        except FileExistsError:
            continue  # another process made it meanwhile
        os.chmod(level, DIR_MODE)
        _fsync_dir(level.parent)


def _fsync_dir(d: Path) -> None:
    """Make a link, rename or new entry in `d` durable (the file's own fsync does not)."""
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_temp(directory: Path, data: bytes) -> str:
    """Write data durably to a new 0600 temp file in `directory`; returns its path."""
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, FILE_MODE)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return tmp


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = _write_temp(path.parent, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _read_int(path: Path, index: int, typecode: str) -> int:
    a = array(typecode)
    with open(path, "rb") as f:
        f.seek(index * a.itemsize)
        a.frombytes(f.read(a.itemsize))
    return int(a[0])
