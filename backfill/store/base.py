"""The store interface (`Store`, `Upload`) and what every store shares: the File object, the
line index's layout, the streaming helpers.

A backend implements every abstract method below; each one's docstring is its contract. The
logic that does not depend on where bytes live (the upload's size cap, a file's metadata at
`finish`, the index's layout and its "`index.json` last" rule, finalizing's `settle_results`,
`expired_files`) is here, once.
"""

from __future__ import annotations

import json
import time
from abc import ABC, abstractmethod
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

from pydantic import BaseModel

from backfill.ids import new_file_id

CHUNK_BYTES = 1 << 20
"""Size of the chunks a file's content is streamed in (`iter_file`)."""
FINALIZED = "finalized.json"
"""The name of a batch's finalized record, the one thing `drop_batch_work` keeps."""


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
