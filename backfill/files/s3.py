"""The S3 store: the `Store` interface on any S3-compatible object store (AWS S3, MinIO, Ceph...).

Keys, under `BACKFILL_S3_PREFIX` (docs/storage.md):

    files/<file id>.data            the content (multipart upload when bigger than one part)
    files/<file id>.json            its metadata (FileObject), written after the content
    workspaces/<workspace>/files/<file id>   an empty entry per file: its workspace's index
    workspaces/.indexed             the mark that every file has its entry
    batches/<batch id>/input.jsonl  the pinned input: a server-side copy of the upload
    batches/<batch id>/offsets.bin, lengths.bin, route-<n>.bin, index.json   the line index
    batches/<batch id>/results/<line // 1000, 5 digits>/<line>.json one committed record per line
    batches/<batch id>/finalized.json                        what finalizing published

First writer wins (results, the finalized record) with conditional writes: `PutObject` with
`If-None-Match: *` succeeds only if the key does not exist; the loser gets 412 and reads the
winner's record. Reads stream (`GetObject`'s body, ranged for single lines); the line index is
read in blocks kept in a small bounded cache (an index never changes once written), so a line
costs one ranged read of the input, not a download of it.

The bucket's plain object operations, the client and the conditional-write check are
`backfill.files.s3_objects` (`S3Store` builds on `S3Objects`); a file's upload (`S3Upload`) is
here, with the store whose keys it writes.

boto3 is synchronous and its client is thread-safe: every call here runs in a caller's thread
(the worker's store pool, the api's `asyncio.to_thread`). Credentials come from boto3's standard
chain (environment, shared files, instance/pod roles) and are never logged nor passed through
Temporal.
"""

from __future__ import annotations

import io
import json
import logging
import threading
from array import array
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, BinaryIO

from botocore.exceptions import ClientError

from backfill.files.base import FINALIZED, INDEX_MARK, FileObject, Store, Upload, workspace_key
from backfill.files.s3_objects import (
    NOT_FOUND,
    PROBE_KEY,
    READ_BUFFER_BYTES,
    BodyReader,
    S3Objects,
    UnfitStore,
    error_code,
    s3_client,
)
from backfill.platform.ids import is_batch_id, is_file_id, new_file_id

__all__ = ["PROBE_KEY", "S3Store", "S3Upload", "UnfitStore"]

if TYPE_CHECKING:
    from backfill.platform.config import Settings

log = logging.getLogger(__name__)

INDEX_BLOCK_ENTRIES = 8192
"""Entries of an index array read at once (64 KiB of offsets)."""
INDEX_CACHE_BLOCKS = 256
"""Most index blocks kept (at most 16 MiB; 3 blocks cover 8,192 lines of a route)."""
LIST_THREADS = 8
"""Parallel metadata reads when listing files (a workspace's, or all), and index writes when
indexing a store from before the index."""
SETTLE_THREADS = 16
"""Parallel result reads (and fills) when finalizing (`settle_results`)."""
SETTLE_AHEAD = 128
"""Lines read ahead of the one finalizing writes: their records are the memory it holds."""


class S3Store(S3Objects, Store):
    """The `Store` interface on a bucket's objects (`S3Objects`)."""

    def __init__(self, client: Any, bucket: str, prefix: str = "", part_bytes: int = 8 << 20):
        super().__init__(client, bucket, prefix)
        self.part_bytes = part_bytes
        self._blocks: OrderedDict[tuple[str, str, int], array] = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Settings) -> S3Store:
        assert settings.s3_bucket is not None  # Settings checks it
        client = s3_client(settings)
        log.info(
            "file store: s3 bucket %s prefix %r endpoint %s",
            settings.s3_bucket,
            settings.s3_prefix,
            settings.s3_endpoint_url or "(AWS)",
        )
        store = cls(client, settings.s3_bucket, settings.s3_prefix, settings.s3_part_bytes)
        store.check_conditional_writes()
        return store

    # ---- keys and plain object operations ------------------------------------------------------
    def _file_key(self, file_id: str, ext: str) -> str:
        if not is_file_id(file_id):
            raise KeyError(file_id)
        return f"{self.prefix}files/{file_id}.{ext}"

    def _batch_key(self, batch_id: str, name: str) -> str:
        if not is_batch_id(batch_id):
            raise KeyError(batch_id)
        return f"{self.prefix}batches/{batch_id}/{name}"

    # ---- files ------------------------------------------------------------------------------
    def begin_upload(self, max_bytes: int, file_id: str | None = None) -> S3Upload:
        return S3Upload(self, max_bytes, file_id)

    def update_file(self, obj: FileObject) -> None:
        self._index_put(obj.workspace, obj.id)
        self._put(self._file_key(obj.id, "json"), obj.model_dump_json().encode())

    def get_file(self, file_id: str) -> FileObject | None:
        try:
            data = self._get(self._file_key(file_id, "json"))
        except KeyError:
            return None
        return None if data is None else FileObject.model_validate_json(data)

    def _scan_files(self) -> list[FileObject]:
        keys = [k for k in self._list(f"{self.prefix}files/") if k.endswith(".json")]

        def read(key: str) -> FileObject | None:
            data = self._get(key)
            try:
                return None if data is None else FileObject.model_validate_json(data)
            except ValueError:
                return None

        with ThreadPoolExecutor(LIST_THREADS) as pool:
            found = list(pool.map(read, keys))
        return [f for f in found if f is not None]

    def _read_files(self, file_ids: list[str]) -> list[FileObject | None]:
        with ThreadPoolExecutor(LIST_THREADS) as pool:
            return list(pool.map(self.get_file, file_ids))

    def _index_put_all(self, files: list[FileObject]) -> None:
        with ThreadPoolExecutor(LIST_THREADS) as pool:
            list(pool.map(lambda f: self._index_put(f.workspace, f.id), files))

    # ---- files: the workspace index (`workspaces/<key>/files/<id>`, empty objects) ------------
    def _index_key(self, workspace_key: str, file_id: str) -> str:
        if not is_file_id(file_id):
            raise KeyError(file_id)
        return f"{self.prefix}workspaces/{workspace_key}/files/{file_id}"

    def _index_ids(self, workspace: str) -> list[str]:
        base = f"{self.prefix}workspaces/{workspace_key(workspace)}/files/"
        return [k[len(base) :] for k in self._list(base) if is_file_id(k[len(base) :])]

    def _index_entries(self) -> dict[tuple[str, str], float]:
        base = f"{self.prefix}workspaces/"
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=base
        )
        out = {}
        for page in pages:
            for item in page.get("Contents", []):
                wkey, _, rest = item["Key"][len(base) :].partition("/files/")
                if rest and is_file_id(rest):
                    out[(wkey, rest)] = item["LastModified"].timestamp()
        return out

    def _index_put(self, workspace: str, file_id: str) -> None:
        self._put(self._index_key(workspace_key(workspace), file_id), b"")

    def _index_drop(self, workspace_key: str, file_id: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._index_key(workspace_key, file_id))

    def _index_marked(self) -> bool:
        return self._exists(self.prefix + INDEX_MARK)

    def _index_mark(self) -> None:
        self._put(self.prefix + INDEX_MARK, b"")

    def open_file(self, file_id: str) -> BinaryIO:
        try:
            key = self._file_key(file_id, "data")
        except KeyError:
            raise FileNotFoundError(file_id) from None
        f = self._open(key)
        if f is None:
            raise FileNotFoundError(file_id)
        return f

    def read_file_head(self, file_id: str, max_bytes: int) -> bytes:
        """A ranged GET of the first `max_bytes` (an empty file reads empty)."""
        try:
            key = self._file_key(file_id, "data")
        except KeyError:
            raise FileNotFoundError(file_id) from None
        if max_bytes <= 0:
            return b""
        try:
            data = self._get(key, f"bytes=0-{max_bytes - 1}")
        except ClientError as err:
            if error_code(err) == "InvalidRange":  # an empty file
                return b""
            raise
        if data is None:
            raise FileNotFoundError(file_id)
        return data

    def open_file_from(self, file_id: str, offset: int) -> BinaryIO:
        """A ranged GET from `offset`: the bytes before it are never transferred."""
        if offset <= 0:
            return self.open_file(file_id)
        try:
            key = self._file_key(file_id, "data")
        except KeyError:
            raise FileNotFoundError(file_id) from None
        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=key, Range=f"bytes={offset}-")
        except ClientError as err:
            if error_code(err) in NOT_FOUND:
                raise FileNotFoundError(file_id) from None
            if error_code(err) == "InvalidRange":  # at or past the end
                return io.BytesIO(b"")
            raise
        return io.BufferedReader(BodyReader(resp["Body"]), READ_BUFFER_BYTES)

    def delete_file(self, file_id: str) -> bool:
        try:
            meta = self._file_key(file_id, "json")
        except KeyError:
            return False
        obj = self.get_file(file_id)
        if obj is None:
            return False
        self.client.delete_object(Bucket=self.bucket, Key=meta)
        self.client.delete_object(Bucket=self.bucket, Key=self._file_key(file_id, "data"))
        self._index_drop(workspace_key(obj.workspace), file_id)
        return True

    def keys(self, prefix: str) -> list[str]:
        start = len(self.prefix)
        names = [k[start:] for k in self._list(self.prefix + prefix)]
        names += [f"{key[start:]}#upload" for key, _, _ in self._uploads(self.prefix + prefix)]
        return sorted(names)

    def drop_abandoned_uploads(self, before: float) -> int:
        """Multipart uploads neither begun nor given a part since `before` are aborted (an
        upload smaller than a part is only in the memory of its process, and died with it)."""
        dropped = 0
        for key, upload_id, begun in self._uploads(f"{self.prefix}files/"):
            parts = self._parts(key, upload_id)
            if parts is None:
                continue
            written = max([begun] + [p["LastModified"].timestamp() for p in parts])
            if written >= before:
                continue
            try:
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
            except ClientError as err:
                if error_code(err) != "NoSuchUpload":  # finished or aborted meanwhile
                    raise
                continue
            dropped += 1
        return dropped

    def pending_uploads(self) -> dict[str, int]:
        out = {}
        for key, upload_id, _ in self._uploads(f"{self.prefix}files/"):
            parts = self._parts(key, upload_id)
            if parts is not None:
                out[f"{key[len(self.prefix) :]}#{upload_id}"] = sum(p["Size"] for p in parts)
        return out

    # ---- batches: input and line index ----------------------------------------------------------
    def snapshot_input(self, batch_id: str, file_id: str) -> None:
        """A server-side copy (S3 has no links): no bytes pass through this process."""
        target = self._batch_key(batch_id, "input.jsonl")
        if self._exists(target):
            return
        source = self._file_key(file_id, "data")
        try:
            self.client.copy_object(
                Bucket=self.bucket, Key=target, CopySource={"Bucket": self.bucket, "Key": source}
            )
        except ClientError as err:
            if error_code(err) in NOT_FOUND:
                raise FileNotFoundError(file_id) from None
            raise

    def open_input(self, batch_id: str, input_file_id: str) -> BinaryIO:
        f = self._open(self._batch_key(batch_id, "input.jsonl"))
        return f if f is not None else self.open_file(input_file_id)

    def write_index_part(self, batch_id: str, name: str, data: bytes) -> None:
        self._put(self._batch_key(batch_id, name), data)

    def _index_value(self, batch_id: str, name: str, i: int, typecode: str) -> int:
        """Entry `i` of an index array, through the block cache."""
        block, at = divmod(i, INDEX_BLOCK_ENTRIES)
        cache_key = (batch_id, name, block)
        with self._lock:
            values = self._blocks.get(cache_key)
            if values is not None:
                self._blocks.move_to_end(cache_key)
        if values is None:
            size = array(typecode).itemsize
            first = block * INDEX_BLOCK_ENTRIES * size
            last = first + INDEX_BLOCK_ENTRIES * size - 1
            data = self._get(self._batch_key(batch_id, name), f"bytes={first}-{last}")
            if data is None:
                raise FileNotFoundError(f"{batch_id}/{name}")
            values = array(typecode)
            values.frombytes(data)
            with self._lock:
                self._blocks[cache_key] = values
                while len(self._blocks) > INDEX_CACHE_BLOCKS:
                    self._blocks.popitem(last=False)
        return int(values[at])

    def line_number(self, batch_id: str, route_index: int, position: int) -> int:
        return self._index_value(batch_id, f"route-{route_index}.bin", position, "I")

    def read_line(self, batch_id: str, input_file_id: str, line_no: int) -> bytes:
        offset = self._index_value(batch_id, "offsets.bin", line_no, "Q")
        length = self._index_value(batch_id, "lengths.bin", line_no, "I")
        if length == 0:
            return b""
        span = f"bytes={offset}-{offset + length - 1}"
        data = self._get(self._batch_key(batch_id, "input.jsonl"), span)
        if data is None:  # a batch created before inputs were pinned
            data = self._get(self._file_key(input_file_id, "data"), span)
        if data is None:
            raise FileNotFoundError(f"{batch_id} input")
        return data

    def index_total(self, batch_id: str) -> int:
        data = self._get(self._batch_key(batch_id, "index.json"))
        if data is None:
            raise FileNotFoundError(f"{batch_id}/index.json")
        return int(json.loads(data)["total"])

    def iter_lines(self, batch_id: str, input_file_id: str) -> Iterator[tuple[int, bytes]]:
        """One streamed pass over the input and the two index arrays (lines are in file order,
        so the input is read forward only)."""
        offsets_f = self._open(self._batch_key(batch_id, "offsets.bin"))
        lengths_f = self._open(self._batch_key(batch_id, "lengths.bin"))
        if offsets_f is None or lengths_f is None:
            raise FileNotFoundError(f"{batch_id} index")
        with offsets_f, lengths_f, self.open_input(batch_id, input_file_id) as inp:
            offsets = _iter_array(offsets_f, "Q")
            lengths = _iter_array(lengths_f, "I")
            pos = 0
            for i, (off, ln) in enumerate(zip(offsets, lengths, strict=True)):
                if off < pos:
                    raise ValueError(f"{batch_id}: line {i} starts before line {i - 1} ends")
                while pos < off:  # the bytes between lines (newlines, skipped blank lines)
                    skipped = len(inp.read(min(off - pos, READ_BUFFER_BYTES)))
                    if not skipped:
                        raise EOFError(f"{batch_id}: the input ends before line {i}")
                    pos += skipped
                line = inp.read(ln)
                pos += len(line)
                yield i, line

    def settle_results(
        self, batch_id: str, input_file_id: str, fill: Callable[[int, bytes], bytes]
    ) -> Iterator[tuple[int, bytes, bytes]]:
        """As the base, with up to SETTLE_AHEAD lines' reads (and fills) in flight at once:
        one request after another would make a 200,000-line batch wait on 200,000 round trips."""

        def settle(line_no: int, raw: bytes) -> tuple[int, bytes, bytes]:
            data = self.get_result(batch_id, line_no)
            if data is None:
                data, _ = self.commit_result(batch_id, line_no, fill(line_no, raw))
            return line_no, raw, data

        with ThreadPoolExecutor(SETTLE_THREADS, thread_name_prefix="s3-settle") as pool:
            ahead: deque[Future[tuple[int, bytes, bytes]]] = deque()
            try:
                for line_no, raw in self.iter_lines(batch_id, input_file_id):
                    ahead.append(pool.submit(settle, line_no, raw))
                    if len(ahead) >= SETTLE_AHEAD:
                        yield ahead.popleft().result()
                while ahead:
                    yield ahead.popleft().result()
            finally:
                for f in ahead:
                    f.cancel()

    # ---- batches: the end --------------------------------------------------------------------
    def read_finalized(self, batch_id: str) -> bytes | None:
        return self._get(self._batch_key(batch_id, FINALIZED))

    def write_finalized(self, batch_id: str, summary: bytes) -> None:
        """First writer wins: a second finalizing run (same files) keeps the first's record."""
        self._put_first(self._batch_key(batch_id, FINALIZED), summary)

    def drop_batch_work(self, batch_id: str) -> None:
        keep = self._batch_key(batch_id, FINALIZED)
        keys = [k for k in self._list(self._batch_key(batch_id, "")) if k != keep]
        self._delete_keys(keys)
        with self._lock:
            for cache_key in [k for k in self._blocks if k[0] == batch_id]:
                del self._blocks[cache_key]

    def _walk_batches(self) -> Iterator[tuple[str, str, bool]]:
        """One listing of `batches/` in key order, where a batch's `finalized.json` comes
        before its other keys (`index.json`, `input.jsonl`, `lengths.bin`, `offsets.bin`,
        `partials/`, `results/`, `route-<n>.bin` all sort after it): (batch id, key, finalized)
        for every key of a finalized batch, and for the first key only of a batch that is not
        (the listing then starts again after `<batch id>0`: no character sorts between `/` and
        `0`), so a running batch's results cost one listing, not one a thousand keys."""
        base = f"{self.prefix}batches/"
        after = ""
        current, finalized = "", False
        while True:
            start = {"StartAfter": after} if after else {}
            page = self.client.list_objects_v2(Bucket=self.bucket, Prefix=base, **start)
            contents = page.get("Contents", [])
            skip_to = None
            for item in contents:
                key = item["Key"]
                batch_id, _, name = key[len(base) :].partition("/")
                if batch_id != current:
                    current, finalized = batch_id, name == FINALIZED
                yield batch_id, key, finalized
                if not finalized:
                    skip_to = f"{base}{batch_id}0"
                    break
            if skip_to is not None:
                after = skip_to
            elif contents and page.get("IsTruncated"):
                after = contents[-1]["Key"]
            else:
                return

    def drop_finalized_leftovers(self) -> int:
        """The keys after a finalized batch's `finalized.json` (`_walk_batches`) are leftovers,
        deleted 1,000 a call."""
        leftovers: list[str] = []
        swept: set[str] = set()
        for batch_id, key, finalized in self._walk_batches():
            if finalized and not key.endswith(f"/{FINALIZED}"):
                leftovers.append(key)
                swept.add(batch_id)
                if len(leftovers) >= 1000:
                    self._delete_keys(leftovers)
                    leftovers = []
        self._delete_keys(leftovers)
        with self._lock:
            for cache_key in [k for k in self._blocks if k[0] in swept]:
                del self._blocks[cache_key]
        return len(swept)

    def unfinalized_batches(self) -> list[str]:
        """A batch whose first key is not `finalized.json` has none (`_walk_batches`)."""
        return [b for b, _, finalized in self._walk_batches() if not finalized and is_batch_id(b)]

    # ---- batches: per-line results --------------------------------------------------------------
    def _result_key(self, batch_id: str, line_no: int) -> str:
        return self._batch_key(batch_id, f"results/{line_no // 1000:05d}/{line_no}.json")

    def commit_result(self, batch_id: str, line_no: int, record: bytes) -> tuple[bytes, bool]:
        """Also under a finalized batch (a line of a worker that lost its heartbeat): looking
        for the finalized record first would cost every line a request;
        `drop_finalized_leftovers` removes such a record instead."""
        return self._put_first(self._result_key(batch_id, line_no), record)

    def get_result(self, batch_id: str, line_no: int) -> bytes | None:
        return self._get(self._result_key(batch_id, line_no))

    def get_result_head(self, batch_id: str, line_no: int, max_bytes: int) -> bytes | None:
        """A ranged GET: the rest of the record is never transferred."""
        if max_bytes <= 0:
            return b"" if self.get_result(batch_id, line_no) is not None else None
        return self._get(self._result_key(batch_id, line_no), f"bytes=0-{max_bytes - 1}")

    def _partial_key(self, batch_id: str, line_no: int) -> str:
        return self._batch_key(batch_id, f"partials/{line_no // 1000:05d}/{line_no}.json")

    def put_partial(self, batch_id: str, line_no: int, data: bytes) -> None:
        self._put(self._partial_key(batch_id, line_no), data)

    def get_partial(self, batch_id: str, line_no: int) -> bytes | None:
        return self._get(self._partial_key(batch_id, line_no))


def _iter_array(f: BinaryIO, typecode: str) -> Iterator[int]:
    """The values of a streamed array file, one block at a time."""
    itemsize = array(typecode).itemsize
    while data := f.read(INDEX_BLOCK_ENTRIES * itemsize):
        values = array(typecode)
        values.frombytes(data)
        yield from values


class S3Upload(Upload):
    """Buffers up to one part in memory; from the first full part on, a multipart upload
    (aborted on `abort`). A file smaller than a part is one `PutObject` at `finish`."""

    def __init__(self, store: S3Store, max_bytes: int, file_id: str | None = None) -> None:
        super().__init__(max_bytes)
        self.store = store
        self._id = file_id or new_file_id()
        """The file id the parts are uploaded under (finish may name another: then a copy)."""
        self._buf = bytearray()
        self._upload_id: str | None = None
        self._parts: list[dict[str, Any]] = []

    @property
    def _key(self) -> str:
        return self.store._file_key(self._id, "data")

    def write_chunk(self, chunk: bytes) -> None:
        self._buf += chunk
        while len(self._buf) >= self.store.part_bytes:
            part = bytes(self._buf[: self.store.part_bytes])
            del self._buf[: self.store.part_bytes]
            self._send_part(part)

    def _send_part(self, data: bytes) -> None:
        s = self.store
        if self._upload_id is None:
            resp = s.client.create_multipart_upload(Bucket=s.bucket, Key=self._key)
            self._upload_id = resp["UploadId"]
        number = len(self._parts) + 1
        resp = s.client.upload_part(
            Bucket=s.bucket, Key=self._key, UploadId=self._upload_id, PartNumber=number, Body=data
        )
        self._parts.append({"PartNumber": number, "ETag": resp["ETag"]})

    def publish(self, obj: FileObject) -> None:
        s = self.store
        if self._upload_id is None:  # smaller than a part: one put, straight to its key
            s._put(s._file_key(obj.id, "data"), bytes(self._buf))
        else:
            if self._buf:
                self._send_part(bytes(self._buf))
            self._buf.clear()
            s.client.complete_multipart_upload(
                Bucket=s.bucket,
                Key=self._key,
                UploadId=self._upload_id,
                MultipartUpload={"Parts": self._parts},
            )
            self._upload_id = None
            if obj.id != self._id:  # the caller named the file at the end: move it there
                target = s._file_key(obj.id, "data")
                s.client.copy_object(
                    Bucket=s.bucket, Key=target, CopySource={"Bucket": s.bucket, "Key": self._key}
                )
                s.client.delete_object(Bucket=s.bucket, Key=self._key)
        s.update_file(obj)

    def abort(self) -> None:
        self._buf = bytearray()
        if self._upload_id is not None:
            upload_id, self._upload_id = self._upload_id, None
            try:
                self.store.client.abort_multipart_upload(
                    Bucket=self.store.bucket, Key=self._key, UploadId=upload_id
                )
            except ClientError as err:
                if error_code(err) != "NoSuchUpload":
                    raise
