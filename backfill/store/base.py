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
"""Size of the chunks a file's content is streamed in (`chunks`)."""
FINALIZED = "finalized.json"
"""The name of a batch's finalized record, the one thing `drop_batch_work` keeps."""
ABANDONED_UPLOAD_SECONDS = 24 * 3600
"""An unfinished upload older than this was abandoned by a process that died mid-upload, and
the retention pass drops it (`Store.drop_abandoned_uploads`). No upload legitimately takes a
day: the api streams a body as it arrives, finalizing writes its outputs in minutes."""


class FileTooLarge(Exception):
    """An upload went past the configured size cap while streaming."""


class BatchFinalized(Exception):
    """A line's result came after its batch was finalized (from a worker that lost its
    heartbeat, whose line ran again elsewhere): the batch's work is dropped and the result is
    not kept (`Store.commit_result`)."""


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
    no-op after `finish`).

    Callers use `write`, `finish` and `abort`. A backend implements `write_chunk`, `publish`
    and `abort`; the cap and the new file's metadata are this class's."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.size = 0
        """Bytes written so far."""

    def write(self, chunk: bytes) -> None:
        """Add `chunk` to the upload; FileTooLarge (nothing of it kept) once the upload would
        pass `max_bytes`. The caller then aborts."""
        self.size += len(chunk)
        if self.size > self.max_bytes:
            raise FileTooLarge(self.size)
        self.write_chunk(chunk)

    @abstractmethod
    def write_chunk(self, chunk: bytes) -> None:
        """Keep `chunk` after the bytes written so far (`write` has checked the cap: callers
        call `write`, never this). The bytes need not be visible as a file before `publish`;
        what the store holds of them meanwhile shows in `Store.pending_uploads`. Raises what
        the storage raises (OSError, the S3 client's errors); the caller then aborts."""

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
        self.publish(obj)
        return obj

    @abstractmethod
    def publish(self, obj: FileObject) -> None:
        """Make every byte written the content of `obj.id`, then write `obj` as its metadata
        (`Store.update_file`), in that order: a file whose metadata can be read has its whole
        content, and a reader never sees part of it. An existing file of that id is replaced
        (a re-run of finalizing writes the same bytes under the same id). Durable when it
        returns; nothing of the upload is left pending. Called once, by `finish`; KeyError if
        `obj.id` is not a file id."""

    @abstractmethod
    def abort(self) -> None:
        """Drop what was written (temp file, buffered bytes, multipart upload): after it
        nothing of the upload is stored nor pending. Safe to repeat, and a no-op after
        `publish` (the published file stays)."""


class Store(ABC):
    """Where uploads, batch indexes, per-line results and outputs live (see the package doc).

    Every method blocks (disk or network): callers run them in threads, several at once, so a
    backend is thread-safe. Methods that read a batch's input take `input_file_id` too, for
    batches created before inputs were pinned.

    Ids are checked, never followed: a malformed file id reads as no such file (`get_file`
    None, `delete_file` False, `open_file` FileNotFoundError) and raises KeyError where a file
    is written or pinned; a malformed batch id raises KeyError wherever one is taken.

    Every write is atomic (a reader sees the old bytes or the new, never part) and durable when
    the method returns (a crash afterwards loses nothing the caller was told about).

    A backend implements the abstract methods below, each documented with its contract
    (`tests/unit/test_store_contract.py` runs every store through them); `write_index`,
    `settle_results`, `expired_files` and `read_file` are built on them here."""

    # ---- files ------------------------------------------------------------------------------
    @abstractmethod
    def begin_upload(self, max_bytes: int, file_id: str | None = None) -> Upload:
        """A new upload of at most `max_bytes`; `file_id` names the file it will be when known
        now (finish may still name it; the S3 store then saves a server-side copy of a
        multipart upload). Nothing is visible as a file until its `finish`."""

    @abstractmethod
    def get_file(self, file_id: str) -> FileObject | None:
        """The file's metadata; None if there is no such file (or the id is malformed)."""

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
        """Write `obj` as the metadata of `obj.id`, whole, replacing what was there (e.g. a new
        expiry); the content is unchanged. Also `Upload.publish`'s last step. KeyError if
        `obj.id` is not a file id."""

    @abstractmethod
    def open_file(self, file_id: str) -> BinaryIO:
        """The file's content as a stream (close it); FileNotFoundError if there is none (or
        the id is malformed)."""

    def open_file_from(self, file_id: str, offset: int) -> BinaryIO:
        """The file's content from byte `offset` on (none past its end), without reading what
        comes before where the backend can; FileNotFoundError as `open_file`."""
        f = self.open_file(file_id)
        if f.seekable():
            f.seek(offset)
            return f
        left = offset
        while left > 0:  # a backend whose stream cannot seek: read past the start
            got = f.read(min(left, 1 << 20))
            if not got:
                break
            left -= len(got)
        return f

    def read_file(self, file_id: str) -> bytes:
        """The whole content at once: for small files and tests, never for a batch's input."""
        with self.open_file(file_id) as f:
            return f.read()

    @abstractmethod
    def delete_file(self, file_id: str) -> bool:
        """Delete the file, its metadata first (so it is gone for every reader at once), then
        its content. False if there was no such file (or the id is malformed). A batch's
        pinned copy of it stays (`snapshot_input`)."""

    @abstractmethod
    def keys(self, prefix: str) -> list[str]:
        """Names of everything stored under `prefix` (`files/`, `batches/<id>/`), relative to
        the store's root, sorted, unfinished uploads included (named as the store likes): for
        operators and tests. The layout is the same on every store: `files/<id>.data` and
        `.json`, `batches/<id>/` with `input.jsonl`, the index files (`write_index`),
        `results/<line // 1000>/<line>.json` and `finalized.json`."""

    @abstractmethod
    def drop_abandoned_uploads(self, before: float) -> int:
        """Drop what unfinished uploads not written since `before` (Unix seconds) hold, as
        their `abort` would: left behind by a process that died mid-upload, nothing else would
        ever remove them. Returns how many were dropped. An upload in progress writes as its
        body arrives, so it is left alone; the retention pass passes `now -
        ABANDONED_UPLOAD_SECONDS`."""

    @abstractmethod
    def pending_uploads(self) -> dict[str, int]:
        """Uploads begun and neither finished nor aborted (by a name of the store's): the
        bytes each holds in the store so far (a store may hold back the last bytes in memory,
        the S3 store up to one part). Empty once every upload is finished or aborted."""

    # ---- batches: input and line index ----------------------------------------------------------
    @abstractmethod
    def snapshot_input(self, batch_id: str, file_id: str) -> None:
        """Pin the batch's input (`input.jsonl`, a copy of the file's content), so deleting the
        uploaded file (the user's right) never pulls the lines from under a running batch
        (decision 0007). Safe to repeat: an existing pin is kept. FileNotFoundError if there
        is no such file; durable when it returns."""

    @abstractmethod
    def open_input(self, batch_id: str, input_file_id: str) -> BinaryIO:
        """The batch's pinned input as a stream (close it), or the uploaded file's content for
        a batch not pinned; FileNotFoundError if neither exists."""

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
        self.write_index_part(batch_id, "offsets.bin", offsets.tobytes())
        self.write_index_part(batch_id, "lengths.bin", lengths.tobytes())
        for i, nums in enumerate(route_line_numbers):
            self.write_index_part(batch_id, f"route-{i}.bin", nums.tobytes())
        self.write_index_part(batch_id, "index.json", index_meta(offsets, routes))

    @abstractmethod
    def write_index_part(self, batch_id: str, name: str, data: bytes) -> None:
        """Store `data` as the batch's index file `name` (`offsets.bin`: uint64 per line,
        `lengths.bin`: uint32 per line, `route-<n>.bin`: uint32 line numbers, `index.json`),
        whole, atomically and durably, replacing one of that name. Called by `write_index`,
        which fixes the layout and the order. A store may keep index files cached for reading
        lines: they never change once the batch's lines run (a rewrite writes the same bytes)."""

    @abstractmethod
    def line_number(self, batch_id: str, route_index: int, position: int) -> int:
        """The input line number at `position` in a route's list of lines (`route-<n>.bin`).
        FileNotFoundError if the batch has no index (never written, or dropped)."""

    @abstractmethod
    def read_line(self, batch_id: str, input_file_id: str, line_no: int) -> bytes:
        """One input line: the bytes at its offset and length in the index, read from the
        pinned input (or the upload, for a batch not pinned), never the whole input.
        FileNotFoundError if the index or the input is missing (e.g. the batch's work was
        dropped), however the store caches what it reads."""

    @abstractmethod
    def index_total(self, batch_id: str) -> int:
        """The batch's line count, from `index.json`; FileNotFoundError if there is none."""

    @abstractmethod
    def iter_lines(self, batch_id: str, input_file_id: str) -> Iterator[tuple[int, bytes]]:
        """Every input line in order as (line number, line), by the index, reading the input
        forward once (used when assembling outputs). FileNotFoundError if the index or the
        input is missing."""

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
    def write_finalized(self, batch_id: str, summary: bytes) -> None:
        """Record what finalizing published (`finalized.json`), whole, atomically and durably.
        Finalizing reads the record first and writes only when there is none; two runs that
        race write the same files and counts, so a store may keep either record: the local
        store keeps the last (rename), the S3 store the first (conditional put)."""

    @abstractmethod
    def drop_batch_work(self, batch_id: str) -> None:
        """Remove what only a running batch needs (its pinned input, line index and per-line
        results), keeping the `finalized` record, and forget whatever the store caches of
        them: afterwards the batch's lines read as FileNotFoundError. The uploaded file is the
        user's and stays. Safe to repeat, and on a batch with nothing stored."""

    @abstractmethod
    def drop_finalized_leftovers(self) -> int:
        """Drop the work stored under finalized batches (a line committed after finalizing, a
        `drop_batch_work` cut short), as `drop_batch_work` would, keeping each finalized
        record; batches not finalized keep everything. Returns how many batches had some.
        Run by the retention pass."""

    @abstractmethod
    def unfinalized_batches(self) -> list[str]:
        """Ids of the batches that have work stored (a pinned input, an index, results,
        partial answers) and no finalized record: running batches, and batches that ended
        without finalizing (input rejected, the store unavailable until the deadline,
        terminated), whose work the retention pass drops once their workflow is closed
        (`activities.retention`). In no order."""

    # ---- batches: per-line results --------------------------------------------------------------
    @abstractmethod
    def commit_result(self, batch_id: str, line_no: int, record: bytes) -> tuple[bytes, bool]:
        """Commit a line's result record, first writer wins: of any number of concurrent
        callers (threads, processes, hosts sharing the store), exactly one commits, and every
        one gets the record that won. Never a read-then-write: the store's own atomic
        create-if-absent (`link`, `PutObject` with `If-None-Match: *`) decides. The record is
        whole and durable when a call returns; nothing else is left behind (no temp files).

        Returns (the committed record, True if this call committed it).

        Once the batch is finalized its results are read no more and its work is dropped
        (`drop_batch_work`), but a line whose worker lost its heartbeat may still commit. A
        store either refuses such a commit, raising BatchFinalized and leaving nothing behind
        (the local store: it looks for the finalized record before and after linking), or
        keeps it until `drop_finalized_leftovers` removes it (the S3 store: a look per line
        would be one more request on every line)."""

    @abstractmethod
    def get_result(self, batch_id: str, line_no: int) -> bytes | None:
        """The line's committed record, whole; None if none is committed yet."""

    # ---- batches: preempted lines' partial answers ----------------------------------------------
    @abstractmethod
    def put_partial(self, batch_id: str, line_no: int, data: bytes) -> None:
        """Keep what a preempted line generated so far (decision 0036), replacing what was kept
        before, whole, atomically and durably. Dropped with the batch's work."""

    @abstractmethod
    def get_partial(self, batch_id: str, line_no: int) -> bytes | None:
        """The line's partial answer as last kept; None if none is."""


def index_meta(offsets: array, routes: list[RouteLines]) -> bytes:
    """`index.json`: the line count and the routes' lines."""
    return json.dumps({"total": len(offsets), "routes": [r.__dict__ for r in routes]}).encode()


def chunks(f: BinaryIO, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
    """The chunks of a stream (from `open_file`), closing it at the end or when the iterator
    is closed early."""
    with f:
        while chunk := f.read(chunk_bytes):
            yield chunk
