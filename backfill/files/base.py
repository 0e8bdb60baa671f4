"""The store interface (`Store`, `Upload`) and what every store shares: the File object, the
line index's layout, the streaming helpers.

A backend implements every abstract method below; each one's docstring is its contract. The
logic that does not depend on where bytes live (the upload's size cap, a file's metadata at
`finish`, the index's layout and its "`index.json` last" rule, finalizing's `settle_results`,
`expired_files`, listing a workspace's files through its index and indexing a store from
before it) is here, once.
"""

from __future__ import annotations

import json
import time
from abc import ABC, abstractmethod
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO
from urllib.parse import quote

from pydantic import BaseModel

from backfill.platform.ids import new_file_id

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

    def list_files(self, workspace: str | None) -> list[FileObject]:
        """The metadata of one workspace's files, read through its index (none of another
        workspace's files is read), or of every file with None; in no order.

        A store with files from before the index (an earlier version) is indexed here on the
        first listing (`index_files`): that one listing reads every file, as with None."""
        if workspace is not None and self._indexed():
            found = self._read_files(self._index_ids(workspace))
            return [f for f in found if f is not None and f.workspace == workspace]
        files = self._scan_files()
        if not self._indexed():
            self.index_files(files, int(time.time()))
        return [f for f in files if workspace in (None, f.workspace)]

    def expired_files(self, now: int) -> list[FileObject]:
        """Files whose `expires_at` has passed."""
        return [f for f in self.list_files(None) if has_expired(f, now)]

    def index_files(self, files: list[FileObject], now: int) -> int:
        """Give each of `files` (every file: `list_files(None)`) an entry in its workspace's
        index where it has none (a file written by an earlier version, which kept no index),
        drop the entries of files gone for more than `ABANDONED_UPLOAD_SECONDS` (a delete cut
        short; younger ones may be a file being published), then mark the store indexed, so
        listings of a workspace read through the index from then on. Returns how many entries
        were added. Safe to repeat and to run in several processes at once: the first listing
        of a store without the mark runs it, and so does every retention pass (for files an
        earlier version's process wrote during a rolling upgrade)."""
        entries = self._index_entries()
        live = {(workspace_key(f.workspace), f.id) for f in files}
        missing = [f for f in files if (workspace_key(f.workspace), f.id) not in entries]
        self._index_put_all(missing)
        for (wkey, file_id), written in entries.items():
            if (wkey, file_id) not in live and written < now - ABANDONED_UPLOAD_SECONDS:
                self._index_drop(wkey, file_id)
        self._index_mark()
        self._index_seen = True
        return len(missing)

    _index_seen: bool = False
    """This store has seen its index mark (it is never taken away)."""

    def _indexed(self) -> bool:
        if not self._index_seen:
            self._index_seen = self._index_marked()
        return self._index_seen

    def _index_put_all(self, files: list[FileObject]) -> None:
        """`_index_put` of each file (a backend may write them in parallel)."""
        for f in files:
            self._index_put(f.workspace, f.id)

    def _read_files(self, file_ids: list[str]) -> list[FileObject | None]:
        """`get_file` of each id, in order (a backend may read them in parallel)."""
        return [self.get_file(file_id) for file_id in file_ids]

    @abstractmethod
    def _scan_files(self) -> list[FileObject]:
        """Every file's metadata, read from `files/` (not through the index), in no order."""

    @abstractmethod
    def _index_ids(self, workspace: str) -> list[str]:
        """The file ids in the workspace's index (`workspaces/<key>/files/<id>`), in no order;
        an id may name a file since deleted (`get_file` None)."""

    @abstractmethod
    def _index_entries(self) -> dict[tuple[str, str], float]:
        """Every index entry as (workspace key, file id) -> when it was written (Unix s)."""

    @abstractmethod
    def _index_put(self, workspace: str, file_id: str) -> None:
        """Write the file's entry in its workspace's index (an empty object; kept if there),
        durably. `update_file` does, before it writes the metadata: a file whose metadata can
        be read is in its workspace's index."""

    @abstractmethod
    def _index_drop(self, workspace_key: str, file_id: str) -> None:
        """Remove an index entry (none there: nothing to do)."""

    @abstractmethod
    def _index_marked(self) -> bool:
        """The store holds the index mark (`workspaces/.indexed`): every file was indexed."""

    @abstractmethod
    def _index_mark(self) -> None:
        """Write the index mark, durably."""

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

    def read_file_head(self, file_id: str, max_bytes: int) -> bytes:
        """At most the first `max_bytes` of the file's content, never more read from the
        backend (a job's status reads its record this way); FileNotFoundError as `open_file`."""
        with self.open_file(file_id) as f:
            return f.read(max_bytes)

    @abstractmethod
    def delete_file(self, file_id: str) -> bool:
        """Delete the file, its metadata first (so it is gone for every reader at once), then
        its content, then its entry in its workspace's index. False if there was no such file
        (or the id is malformed). A batch's pinned copy of it stays (`snapshot_input`)."""

    @abstractmethod
    def keys(self, prefix: str) -> list[str]:
        """Names of everything stored under `prefix` (`files/`, `batches/<id>/`), relative to
        the store's root, sorted, unfinished uploads included (named as the store likes): for
        operators and tests. The layout is the same on every store: `files/<id>.data` and
        `.json`, `workspaces/<workspace key>/files/<id>` (`list_files`), `batches/<id>/`
        with `input.jsonl`, the index files (`write_index`),
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

    def get_result_head(self, batch_id: str, line_no: int, max_bytes: int) -> bytes | None:
        """At most the first `max_bytes` of the line's committed record; None as `get_result`.
        A store whose backend can read part of an object reads no more than that."""
        record = self.get_result(batch_id, line_no)
        return None if record is None else record[:max_bytes]

    # ---- batches: preempted lines' partial answers ----------------------------------------------
    @abstractmethod
    def put_partial(self, batch_id: str, line_no: int, data: bytes) -> None:
        """Keep what a preempted line generated so far (decision 0036), replacing what was kept
        before, whole, atomically and durably. Dropped with the batch's work."""

    @abstractmethod
    def get_partial(self, batch_id: str, line_no: int) -> bytes | None:
        """The line's partial answer as last kept; None if none is."""


def has_expired(f: FileObject, now: int) -> bool:
    return f.expires_at is not None and f.expires_at <= now


INDEX_MARK = "workspaces/.indexed"
"""Where a store records that every file has its entry in its workspace's index."""


def workspace_key(workspace: str) -> str:
    """The workspace's name as one level of a key (`workspaces/<key>/files/`): workspace names
    are `[A-Za-z0-9][A-Za-z0-9._-]*` (the config checks them), kept as they are; any other
    character, and a leading dot, is percent-encoded, so no name makes a path of its own."""
    key = quote(workspace, safe="")
    return "%2E" + key[1:] if key.startswith(".") else key or "%00"


def index_meta(offsets: array, routes: list[RouteLines]) -> bytes:
    """`index.json`: the line count and the routes' lines."""
    return json.dumps({"total": len(offsets), "routes": [r.__dict__ for r in routes]}).encode()


def chunks(f: BinaryIO, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
    """The chunks of a stream (from `open_file`), closing it at the end or when the iterator
    is closed early."""
    with f:
        while chunk := f.read(chunk_bytes):
            yield chunk
