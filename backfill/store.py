"""The file store: uploads, batch line indexes, per-line result records, assembled outputs.

`Store` is the interface every caller uses; it hands out streams, iterators and bytes, never a
filesystem path, so the api and the workers run the same way on either store:

- `FileStore` (the default, `BACKFILL_STORE=local`): a local directory (one host, or several
  hosts on a shared volume). Files are written 0600 and every directory level the store creates
  0750, whatever the umask. Writes are atomic (temp file + rename or link) and durable (the
  file, then its directory, is fsynced), so a crash never leaves half a file behind nor loses a
  commit the caller was told about.
- `backfill.s3store.S3Store` (`BACKFILL_STORE=s3`): any S3-compatible object store
  (docs/storage.md, docs/decisions/0013-s3-store.md).

On both, per-line results are committed first-writer-wins: a line that ran twice (a worker died
after writing) keeps its first record, so it is committed exactly once. `open_store(settings)`
makes the configured one.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from pydantic import BaseModel

from backfill.ids import is_batch_id, is_file_id, new_file_id

if TYPE_CHECKING:
    from backfill.config import Settings

FILE_MODE = 0o600
DIR_MODE = 0o750
CHUNK_BYTES = 1 << 20
"""Size of the chunks a file's content is streamed in (`iter_file`)."""


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


class Upload(ABC):
    """A streaming upload into the store: write chunks, the cap enforced as they arrive; then
    `finish` (publish it as a file) or `abort` (drop what was written; safe to repeat, and a
    no-op after `finish`)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.size = 0
        """Bytes written so far."""

    def write(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.max_bytes:
            raise FileTooLarge(self.size)
        self._write(chunk)

    @abstractmethod
    def _write(self, chunk: bytes) -> None: ...

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
        """Publish the upload; it expires `expires_after` seconds after `now` (None: never).

        With `file_id` given, an existing file of that id is replaced (idempotent outputs)."""
        now = int(time.time()) if now is None else now
        obj = FileObject(
            id=file_id or new_file_id(),
            bytes=self.size,
            created_at=now,
            filename=filename,
            purpose=purpose,
            workspace=workspace,
            expires_at=None if expires_after is None else now + expires_after,
        )
        self._publish(obj)
        return obj

    @abstractmethod
    def _publish(self, obj: FileObject) -> None:
        """Make the written bytes the content of `obj.id`, then write its metadata."""

    @abstractmethod
    def abort(self) -> None: ...


class Store(ABC):
    """Where uploads, batch indexes, per-line results and outputs live (see the module doc).

    Every method blocks (disk or network): callers run them in threads. Methods that read a
    batch's input take `input_file_id` too, for batches created before inputs were pinned."""

    # ---- files ------------------------------------------------------------------------------
    @abstractmethod
    def begin_upload(self, max_bytes: int, file_id: str | None = None) -> Upload:
        """A new upload; `file_id` names the file it will be when known now (finish may
        still name it; the S3 store then saves a server-side copy of a multipart upload)."""

    @abstractmethod
    def get_file(self, file_id: str) -> FileObject | None: ...

    @abstractmethod
    def list_files(self, workspace: str | None) -> list[FileObject]:
        """Every file's metadata (of one workspace, or all with None), in no order."""

    def expired_files(self, now: int) -> list[FileObject]:
        """Files whose `expires_at` has passed."""
        return [
            f for f in self.list_files(None) if f.expires_at is not None and f.expires_at <= now
        ]

    @abstractmethod
    def update_file(self, obj: FileObject) -> None:
        """Rewrite an existing file's metadata (e.g. its expiry); the content is unchanged."""

    @abstractmethod
    def open_file(self, file_id: str) -> BinaryIO:
        """The file's content as a stream (close it); FileNotFoundError if there is none."""

    def read_file(self, file_id: str) -> bytes:
        """The whole content at once: for small files and tests, never for a batch's input."""
        with self.open_file(file_id) as f:
            return f.read()

    @abstractmethod
    def delete_file(self, file_id: str) -> bool: ...

    @abstractmethod
    def keys(self, prefix: str) -> list[str]:
        """Names of everything stored under `prefix` (`files/`, `batches/<id>/`), relative to
        the store's root, unfinished uploads included: for operators and tests."""

    @abstractmethod
    def pending_uploads(self) -> dict[str, int]:
        """Uploads begun and neither finished nor aborted (by name): the bytes each holds in
        the store so far."""

    # ---- batches: input and line index ----------------------------------------------------------
    @abstractmethod
    def snapshot_input(self, batch_id: str, file_id: str) -> None:
        """Pin the batch's input, so deleting the uploaded file (the user's right) never pulls
        the lines from under a running batch (decision 0007). Safe to repeat."""

    @abstractmethod
    def open_input(self, batch_id: str, input_file_id: str) -> BinaryIO:
        """The batch's pinned input as a stream (falls back to the uploaded file)."""

    def write_index(
        self,
        batch_id: str,
        offsets: array,
        lengths: array,
        routes: list[RouteLines],
        route_line_numbers: list[array],
    ) -> None:
        """Write the compact line index: byte offset and length per line, lines per route.
        The index derives from the pinned input alone, so writing it again writes the same.
        `index.json` goes last: a reader that finds it finds the whole index."""
        self._write_index_part(batch_id, "offsets.bin", offsets.tobytes())
        self._write_index_part(batch_id, "lengths.bin", lengths.tobytes())
        for i, nums in enumerate(route_line_numbers):
            self._write_index_part(batch_id, f"route-{i}.bin", nums.tobytes())
        self._write_index_part(batch_id, "index.json", index_meta(offsets, routes))

    @abstractmethod
    def _write_index_part(self, batch_id: str, name: str, data: bytes) -> None:
        """Write one file of a batch's line index, whole and durably (see `write_index`)."""

    @abstractmethod
    def line_number(self, batch_id: str, route_index: int, position: int) -> int:
        """The input line number at `position` in a route's list of lines."""

    @abstractmethod
    def read_line(self, batch_id: str, input_file_id: str, line_no: int) -> bytes:
        """One input line, read by its offset in the index."""

    @abstractmethod
    def index_total(self, batch_id: str) -> int: ...

    @abstractmethod
    def iter_lines(self, batch_id: str, input_file_id: str) -> Iterator[tuple[int, bytes]]:
        """Every input line in order, by the index (used when assembling outputs)."""

    def settle_results(
        self, batch_id: str, input_file_id: str, fill: Callable[[int, bytes], bytes]
    ) -> Iterator[tuple[int, bytes, bytes]]:
        """Every input line in order with its committed record (finalizing). A line without
        one gets `fill(line_no, raw)` committed first-writer-wins (a late writer of that line
        then loses), and the record that won is given."""
        for line_no, raw in self.iter_lines(batch_id, input_file_id):
            data = self.get_result(batch_id, line_no)
            if data is None:
                data, _ = self.commit_result(batch_id, line_no, fill(line_no, raw))
            yield line_no, raw, data

    # ---- batches: the end --------------------------------------------------------------------
    @abstractmethod
    def read_finalized(self, batch_id: str) -> bytes | None:
        """What finalizing recorded when it published the batch's files (None: not yet)."""

    @abstractmethod
    def write_finalized(self, batch_id: str, summary: bytes) -> None: ...

    @abstractmethod
    def drop_batch_work(self, batch_id: str) -> None:
        """Remove what only a running batch needs (its pinned input, line index and per-line
        results), keeping the `finalized` record. Safe to repeat."""

    # ---- batches: per-line results --------------------------------------------------------------
    @abstractmethod
    def commit_result(self, batch_id: str, line_no: int, record: bytes) -> tuple[bytes, bool]:
        """Commit a line's result record, first writer wins.

        Returns (the committed record, True if this call committed it)."""

    @abstractmethod
    def get_result(self, batch_id: str, line_no: int) -> bytes | None: ...


def open_store(settings: Settings) -> Store:
    """The store the settings name: the local directory `data_dir`, or an S3 bucket."""
    if settings.store == "s3":
        from backfill.s3store import S3Store  # boto3 is imported only where it is used

        return S3Store.from_settings(settings)
    return FileStore(settings.data_dir)


class FileStore(Store):
    """The store in a local directory (`data_dir`): `files/<id>.data` + `.json`, and
    `batches/<batch id>/` (decisions 0002 and 0007)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._files = self.root / "files"
        self._batches = self.root / "batches"
        for d in (self.root, self._files, self._batches):
            _mkdir(d)
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

    def _publish(self, data_path: Path, obj: FileObject) -> None:
        """Publish a finished temp file (in this store's directory) as `obj`; an existing file
        of that id is replaced."""
        os.chmod(data_path, FILE_MODE)
        os.replace(data_path, self._data_path(obj.id))
        _fsync_dir(self._files)
        self.update_file(obj)

    def update_file(self, obj: FileObject) -> None:
        _atomic_write(self._meta_path(obj.id), obj.model_dump_json().encode())

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

    def open_file(self, file_id: str) -> BinaryIO:
        try:
            path = self._data_path(file_id)
        except KeyError:
            raise FileNotFoundError(file_id) from None
        return open(path, "rb")

    def delete_file(self, file_id: str) -> bool:
        try:
            self._meta_path(file_id).unlink()
        except (KeyError, FileNotFoundError):
            return False
        self._data_path(file_id).unlink(missing_ok=True)
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

    def _temp_path(self) -> Path:
        fd, name = tempfile.mkstemp(dir=self._files, prefix=".tmp-")
        os.close(fd)
        return Path(name)

    # ---- batches: line index ------------------------------------------------------------------
    def _batch_dir(self, batch_id: str) -> Path:
        if not is_batch_id(batch_id):
            raise KeyError(batch_id)
        return self._batches / batch_id

    def _write_index_part(self, batch_id: str, name: str, data: bytes) -> None:
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
        """`link` fails if the name exists: the first writer wins."""
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

    def _write(self, chunk: bytes) -> None:
        self._f.write(chunk)

    def _publish(self, obj: FileObject) -> None:
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
        self.store._publish(self._path, obj)

    def abort(self) -> None:
        if not self._f.closed:
            self._f.close()
        self._path.unlink(missing_ok=True)


FINALIZED = "finalized.json"


def index_meta(offsets: array, routes: list[RouteLines]) -> bytes:
    """`index.json`: the line count and the routes' lines."""
    return json.dumps({"total": len(offsets), "routes": [r.__dict__ for r in routes]}).encode()


def chunks(f: BinaryIO, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
    """The chunks of a stream (from `open_file`), closing it at the end or when the iterator
    is closed early."""
    with f:
        while chunk := f.read(chunk_bytes):
            yield chunk


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
