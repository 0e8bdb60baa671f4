"""The local store: `FileStore`, the `Store` interface on a local directory (`data_dir`; one
host, or several hosts on a shared volume).

Files are written 0600 and every directory level the store creates 0750, whatever the umask.
Writes are atomic (temp file + rename or link) and durable (the file, then its directory, is
fsynced), so a crash never leaves half a file behind nor loses a commit the caller was told
about. Per-line results are committed first-writer-wins with `link` (decision 0002).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from backfill.files.base import (
    FINALIZED,
    INDEX_MARK,
    BatchFinalized,
    FileObject,
    Store,
    Upload,
    workspace_key,
)
from backfill.platform.ids import is_batch_id, is_file_id

FILE_MODE = 0o600
DIR_MODE = 0o750


class FileStore(Store):
    """The store in a local directory (`data_dir`): `files/<id>.data` + `.json`, each file's
    entry in its workspace's index `workspaces/<key>/files/<id>`, and `batches/<batch id>/`
    (decisions 0002, 0007 and 0048)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._files = self.root / "files"
        self._batches = self.root / "batches"
        self._workspaces = self.root / "workspaces"
        self._mark = self.root / INDEX_MARK  # a directory: no file to count among the store's
        fresh = not self._files.exists()
        for d in (self.root, self._files, self._batches):
            _mkdir(d)
        if fresh:  # nothing from before the index
            self._index_mark()
        self._readers = _ReadHandles(READ_HANDLES)

    # ---- files ------------------------------------------------------------------------------
    def _data_path(self, file_id: str) -> Path:
        if not is_file_id(file_id):
            raise KeyError(file_id)
        return self._files / f"{file_id}.data"

    def _meta_path(self, file_id: str) -> Path:
        if not is_file_id(file_id):
            raise KeyError(file_id)
        return self._files / f"{file_id}.json"

    def begin_upload(self, max_bytes: int, file_id: str | None = None) -> FileUpload:
        return FileUpload(self, max_bytes)  # the name is given by `finish` (a rename)

    def _publish_temp(self, data_path: Path, obj: FileObject) -> None:
        """Publish a finished temp file (in this store's directory) as `obj`; an existing file
        of that id is replaced."""
        os.chmod(data_path, FILE_MODE)
        os.replace(data_path, self._data_path(obj.id))
        _fsync_dir(self._files)
        self.update_file(obj)

    def update_file(self, obj: FileObject) -> None:
        self._index_put(obj.workspace, obj.id)
        _atomic_write(self._meta_path(obj.id), obj.model_dump_json().encode())

    def get_file(self, file_id: str) -> FileObject | None:
        try:
            return FileObject.model_validate_json(self._meta_path(file_id).read_bytes())
        except (KeyError, FileNotFoundError):
            return None

    def _scan_files(self) -> list[FileObject]:
        out = []
        for p in self._files.glob("*.json"):
            try:
                out.append(FileObject.model_validate_json(p.read_bytes()))
            except (FileNotFoundError, ValueError):
                continue
        return out

    # ---- files: the workspace index (`workspaces/<key>/files/<id>`, empty files) --------------
    def _index_dir(self, workspace_key: str) -> Path:
        return self._workspaces / workspace_key / "files"

    def _index_ids(self, workspace: str) -> list[str]:
        try:
            names = os.listdir(self._index_dir(workspace_key(workspace)))
        except FileNotFoundError:
            return []
        return [n for n in names if is_file_id(n)]

    def _index_entries(self) -> dict[tuple[str, str], float]:
        out = {}
        for p in self._workspaces.glob("*/files/*"):
            if not is_file_id(p.name):
                continue
            try:
                out[(p.parent.parent.name, p.name)] = p.stat().st_mtime
            except FileNotFoundError:
                continue
        return out

    def _index_put(self, workspace: str, file_id: str) -> None:
        if not is_file_id(file_id):
            raise KeyError(file_id)
        path = self._index_dir(workspace_key(workspace)) / file_id
        if not path.exists():
            _mkdir(path.parent)
            _atomic_write(path, b"")

    def _index_drop(self, workspace_key: str, file_id: str) -> None:
        d = self._index_dir(workspace_key)
        try:
            (d / file_id).unlink()
        except FileNotFoundError:
            return
        _fsync_dir(d)

    def _index_marked(self) -> bool:
        return self._mark.is_dir()

    def _index_mark(self) -> None:
        _mkdir(self._mark)

    def open_file(self, file_id: str) -> BinaryIO:
        try:
            path = self._data_path(file_id)
        except KeyError:
            raise FileNotFoundError(file_id) from None
        return open(path, "rb")

    def delete_file(self, file_id: str) -> bool:
        """Each unlink is made durable before the next: a crash never keeps metadata whose
        content is gone, and a deletion the caller was told about stays deleted."""
        obj = self.get_file(file_id)
        try:
            self._meta_path(file_id).unlink()
        except (KeyError, FileNotFoundError):
            return False
        _fsync_dir(self._files)
        self._data_path(file_id).unlink(missing_ok=True)
        _fsync_dir(self._files)
        if obj is not None:
            self._index_drop(workspace_key(obj.workspace), file_id)
        return True

    def keys(self, prefix: str) -> list[str]:
        base = self.root / prefix
        if not base.is_dir():
            return []
        return sorted(str(p.relative_to(self.root)) for p in base.rglob("*") if p.is_file())

    def pending_uploads(self) -> dict[str, int]:
        out = {}
        for p in self._files.glob(".tmp-*"):
            try:
                out[p.name] = p.stat().st_size
            except FileNotFoundError:
                continue
        return out

    def drop_abandoned_uploads(self, before: float) -> int:
        """Temp files in `files/` last written before `before`."""
        dropped = 0
        for p in self._files.glob(".tmp-*"):
            try:
                if p.stat().st_mtime >= before:
                    continue
                p.unlink()
            except FileNotFoundError:  # finished or aborted meanwhile
                continue
            dropped += 1
        if dropped:
            _fsync_dir(self._files)
        return dropped

    def _temp_path(self) -> Path:
        fd, name = tempfile.mkstemp(dir=self._files, prefix=".tmp-")
        os.close(fd)
        return Path(name)

    # ---- batches: line index ------------------------------------------------------------------
    def _batch_dir(self, batch_id: str) -> Path:
        if not is_batch_id(batch_id):
            raise KeyError(batch_id)
        return self._batches / batch_id

    def write_index_part(self, batch_id: str, name: str, data: bytes) -> None:
        d = self._batch_dir(batch_id)
        _mkdir(d)
        _atomic_write(d / name, data)

    def snapshot_input(self, batch_id: str, file_id: str) -> None:
        """A hard link in the batch's directory: no bytes copied."""
        d = self._batch_dir(batch_id)
        _mkdir(d)
        target = d / "input.jsonl"
        if not target.exists():
            os.link(self._data_path(file_id), target)
            _fsync_dir(d)

    def _input_path(self, batch_id: str, file_id: str) -> Path:
        """The batch's pinned input (falls back to the uploaded file for older batches)."""
        pinned = self._batch_dir(batch_id) / "input.jsonl"
        return pinned if pinned.exists() else self._data_path(file_id)

    def open_input(self, batch_id: str, input_file_id: str) -> BinaryIO:
        return open(self._input_path(batch_id, input_file_id), "rb")

    def _index_handle(self, batch_id: str, name: str) -> _Handle:
        """A kept read handle on one file of a batch's index (`_ReadHandles`)."""
        return self._readers.get((batch_id, name), lambda: self._batch_dir(batch_id) / name)

    def line_number(self, batch_id: str, route_index: int, position: int) -> int:
        return self._index_handle(batch_id, f"route-{route_index}.bin").read_int(position, "I")

    def read_line(self, batch_id: str, input_file_id: str, line_no: int) -> bytes:
        offset = self._index_handle(batch_id, "offsets.bin").read_int(line_no, "Q")
        length = self._index_handle(batch_id, "lengths.bin").read_int(line_no, "I")
        key = (batch_id, f"input:{input_file_id}")
        f = self._readers.get(key, lambda: self._input_path(batch_id, input_file_id))
        return f.read_at(offset, length)

    def index_total(self, batch_id: str) -> int:
        meta = json.loads((self._batch_dir(batch_id) / "index.json").read_bytes())
        return int(meta["total"])

    def iter_lines(self, batch_id: str, input_file_id: str) -> Iterator[tuple[int, bytes]]:
        d = self._batch_dir(batch_id)
        offsets = array("Q")
        offsets.frombytes((d / "offsets.bin").read_bytes())
        lengths = array("I")
        lengths.frombytes((d / "lengths.bin").read_bytes())
        with open(self._input_path(batch_id, input_file_id), "rb") as f:
            for i, (off, ln) in enumerate(zip(offsets, lengths, strict=True)):
                f.seek(off)
                yield i, f.read(ln)

    # ---- batches: the end --------------------------------------------------------------------
    def read_finalized(self, batch_id: str) -> bytes | None:
        try:
            return (self._batch_dir(batch_id) / "finalized.json").read_bytes()
        except FileNotFoundError:
            return None

    def write_finalized(self, batch_id: str, summary: bytes) -> None:
        d = self._batch_dir(batch_id)
        _mkdir(d)
        _atomic_write(d / "finalized.json", summary)

    def drop_batch_work(self, batch_id: str) -> None:
        d = self._batch_dir(batch_id)
        self._readers.drop(batch_id)  # a line read after this fails, as before the handles
        if not d.exists():
            return
        for entry in d.iterdir():
            if entry.name == FINALIZED:
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
        """`link` fails if the name exists: the first writer wins. A finalized batch refuses:
        its finalized record is looked for before linking and again after, and a link that
        finalizing raced past is undone. Finalizing writes its record before dropping the
        batch's work, so a link is either dropped with the work or seen by the look after."""
        finalized = self._batch_dir(batch_id) / FINALIZED
        if finalized.exists():
            raise BatchFinalized(batch_id)
        path = self._result_path(batch_id, line_no)
        try:
            committed = _link_first(path, record)
        except FileNotFoundError:  # the batch's work was dropped meanwhile
            if finalized.exists():
                _undo_result(path, mine=False)
                raise BatchFinalized(batch_id) from None
            raise
        if committed is not None:
            return committed, False
        if finalized.exists():
            _undo_result(path, mine=True)
            raise BatchFinalized(batch_id)
        return record, True

    def drop_finalized_leftovers(self) -> int:
        dropped = 0
        with os.scandir(self._batches) as batches:
            for entry in batches:
                if not (entry.is_dir() and is_batch_id(entry.name)):
                    continue
                names = os.listdir(entry.path)
                if FINALIZED in names and len(names) > 1:
                    self.drop_batch_work(entry.name)
                    dropped += 1
        return dropped

    def unfinalized_batches(self) -> list[str]:
        found = []
        with os.scandir(self._batches) as batches:
            for entry in batches:
                if entry.is_dir() and is_batch_id(entry.name):
                    names = os.listdir(entry.path)
                    if names and FINALIZED not in names:
                        found.append(entry.name)
        return found

    def get_result(self, batch_id: str, line_no: int) -> bytes | None:
        try:
            return self._result_path(batch_id, line_no).read_bytes()
        except FileNotFoundError:
            return None

    def get_result_head(self, batch_id: str, line_no: int, max_bytes: int) -> bytes | None:
        try:
            with self._result_path(batch_id, line_no).open("rb") as f:
                return f.read(max_bytes)
        except FileNotFoundError:
            return None

    def _partial_path(self, batch_id: str, line_no: int) -> Path:
        d = self._batch_dir(batch_id)
        return d / "partials" / f"{line_no // 1000:05d}" / f"{line_no}.json"

    def put_partial(self, batch_id: str, line_no: int, data: bytes) -> None:
        path = self._partial_path(batch_id, line_no)
        _mkdir(path.parent)
        _atomic_write(path, data)

    def get_partial(self, batch_id: str, line_no: int) -> bytes | None:
        try:
            return self._partial_path(batch_id, line_no).read_bytes()
        except FileNotFoundError:
            return None


READ_HANDLES = 128
"""Files of batches' line indexes and inputs a `FileStore` keeps open for reading lines."""


class _Handle:
    """A read-only file descriptor, closed when the last reference to it goes (so a thread
    that is reading through it when the cache drops it finishes on the file it started on)."""

    __slots__ = ("fd",)

    def __init__(self, path: Path) -> None:
        self.fd = -1  # __del__ runs even when the open below fails
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)

    def read_at(self, offset: int, length: int) -> bytes:
        return os.pread(self.fd, length, offset)

    def read_int(self, index: int, typecode: str) -> int:
        a = array(typecode)
        a.frombytes(self.read_at(index * a.itemsize, a.itemsize))
        return int(a[0])

    def __del__(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)


class _ReadHandles:
    """Open handles on the files lines are read from (a batch's index and its input), least
    recently used dropped past `size`. Those files never change once a batch's lines run:
    the index is written whole before `index.json`, and a rewrite (validation run again)
    writes the same bytes to a new file; a handle kept on the old one reads the same. Reading a
    line costs four `pread`s (its number, offset, length, the line) and no `open`."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._handles: OrderedDict[tuple[str, str], _Handle] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str], path: Callable[[], Path]) -> _Handle:
        with self._lock:
            h = self._handles.get(key)
            if h is not None:
                self._handles.move_to_end(key)
                return h
        h = _Handle(path())  # FileNotFoundError propagates; nothing is cached
        with self._lock:
            self._handles[key] = h
            while len(self._handles) > self._size:
                self._handles.popitem(last=False)
        return h

    def drop(self, batch_id: str) -> None:
        """Forget a batch's handles (its files are being removed)."""
        with self._lock:
            for key in [k for k in self._handles if k[0] == batch_id]:
                del self._handles[key]


class FileUpload(Upload):
    """An upload into a temp file in the store's `files/` directory, renamed into place."""

    def __init__(self, store: FileStore, max_bytes: int) -> None:
        super().__init__(max_bytes)
        self.store = store
        self._path = store._temp_path()
        self._f = open(self._path, "wb")  # noqa: SIM115 - closed in finish/abort

    def write_chunk(self, chunk: bytes) -> None:
        self._f.write(chunk)

    def publish(self, obj: FileObject) -> None:
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
        self.store._publish_temp(self._path, obj)

    def abort(self) -> None:
        if not self._f.closed:
            self._f.close()
        self._path.unlink(missing_ok=True)


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


def _link_first(path: Path, record: bytes) -> bytes | None:
    """Link a durable temp file of `record` as `path` unless it exists: None if linked, else
    the record there."""
    _mkdir(path.parent)
    tmp = _write_temp(path.parent, record)
    try:
        os.link(tmp, path)
    except FileExistsError:
        return path.read_bytes()
    finally:
        Path(tmp).unlink(missing_ok=True)
    _fsync_dir(path.parent)
    return None


def _undo_result(path: Path, *, mine: bool) -> None:
    """Remove a result committed into a finalized batch (`mine`: this call linked it), and the
    directories that held only it, durably."""
    if mine:
        path.unlink(missing_ok=True)
    for level in (path.parent, path.parent.parent):  # results/<n>/, results/
        try:
            level.rmdir()
        except FileNotFoundError:
            continue
        except OSError:  # another line's result is there too: its own commit undoes it
            _fsync_dir(level)
            return
    _fsync_dir(path.parent.parent.parent)


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = _write_temp(path.parent, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
