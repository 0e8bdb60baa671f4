"""The S3 store: the `Store` interface on any S3-compatible object store (AWS S3, MinIO, Ceph...).

Keys, under `BACKFILL_S3_PREFIX` (docs/storage.md):

    files/<file id>.data            the content (multipart upload when bigger than one part)
    files/<file id>.json            its metadata (FileObject), written after the content
    batches/<batch id>/input.jsonl  the pinned input: a server-side copy of the upload
    batches/<batch id>/offsets.bin, lengths.bin, route-<n>.bin, index.json   the line index
    batches/<batch id>/results/<line // 1000, 5 digits>/<line>.json one committed record per line
    batches/<batch id>/finalized.json                        what finalizing published

First writer wins (results, the finalized record) with conditional writes: `PutObject` with
`If-None-Match: *` succeeds only if the key does not exist; the loser gets 412 and reads the
winner's record. Reads stream (`GetObject`'s body, ranged for single lines); the line index is
read in blocks kept in a small bounded cache (an index never changes once written), so a line
costs one ranged read of the input, not a download of it.

boto3 is synchronous and its client is thread-safe: every call here runs in a caller's thread
(the worker's store pool, the api's `asyncio.to_thread`). Credentials come from boto3's standard
chain (environment, shared files, instance/pod roles) and are never logged nor passed through
Temporal.
"""

from __future__ import annotations

import io
import json
import logging
import secrets
import threading
import time
from array import array
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, BinaryIO

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from backfill.ids import is_batch_id, is_file_id, new_file_id
from backfill.store.base import FINALIZED, FileObject, Store, Upload

if TYPE_CHECKING:
    from backfill.config import Settings

log = logging.getLogger(__name__)

INDEX_BLOCK_ENTRIES = 8192
"""Entries of an index array read at once (64 KiB of offsets)."""
INDEX_CACHE_BLOCKS = 256
"""Most index blocks kept (at most 16 MiB; 3 blocks cover 8,192 lines of a route)."""
READ_BUFFER_BYTES = 1 << 20
"""Read-ahead of a streamed object (validation, finalizing, downloads)."""
LIST_THREADS = 8
"""Parallel metadata reads when listing files."""
SETTLE_THREADS = 16
"""Parallel result reads (and fills) when finalizing (`settle_results`)."""
SETTLE_AHEAD = 128
"""Lines read ahead of the one finalizing writes: their records are the memory it holds."""
CONFLICT_RETRIES = 8
"""Times a conditional write is tried again when S3 answers 409 (a concurrent conditional write
to the same key was in progress): the next try gets 200 or 412."""
NOT_FOUND = frozenset({"NoSuchKey", "404", "NotFound"})
PRECONDITION_FAILED = frozenset({"PreconditionFailed", "412"})
CONFLICT = frozenset({"ConditionalRequestConflict", "409"})


PROBE_KEY = "probe/if-none-match-"
"""Where `check_conditional_writes` writes (then deletes) its probe, under the prefix."""


class UnfitStore(RuntimeError):
    """The S3 endpoint cannot keep the store's guarantees (it ignores `If-None-Match: *`, or
    refuses conditional writes): the api and the worker refuse to start with this reason."""


def _code(err: ClientError) -> str:
    return str(err.response.get("Error", {}).get("Code", ""))


class S3Store(Store):
    def __init__(self, client: Any, bucket: str, prefix: str = "", part_bytes: int = 8 << 20):
        self.client = client
        self.bucket = bucket
        self.prefix = prefix
        self.part_bytes = part_bytes
        self._blocks: OrderedDict[tuple[str, str, int], array] = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Settings) -> S3Store:
        assert settings.s3_bucket is not None  # Settings checks it
        custom = settings.s3_endpoint_url is not None
        config = Config(
            retries={"max_attempts": 5, "mode": "standard"},
            max_pool_connections=64,  # the worker's 32 store threads, finalizing, validation
            connect_timeout=10,
            read_timeout=60,
            # S3-compatible servers: path-style URLs, and checksums only where S3 requires them
            # (older MinIO and Ceph reject the default CRC trailers).
            s3={"addressing_style": "path"} if custom else None,
            request_checksum_calculation="when_required" if custom else "when_supported",
            response_checksum_validation="when_required" if custom else "when_supported",
        )
        client = boto3.session.Session().client(
            "s3",
            endpoint_url=settings.s3_endpoint_url,
            region_name=settings.s3_region,
            config=config,
        )
        log.info(
            "file store: s3 bucket %s prefix %r endpoint %s",
            settings.s3_bucket,
            settings.s3_prefix,
            settings.s3_endpoint_url or "(AWS)",
        )
        store = cls(client, settings.s3_bucket, settings.s3_prefix, settings.s3_part_bytes)
        store.check_conditional_writes()
        return store

    def check_conditional_writes(self) -> None:
        """Exactly-once commits rest on `PutObject` with `If-None-Match: *` answering 412 when
        the key exists; a server that ignores the header overwrites instead, silently. Probe
        it: the same conditional put twice on a fresh key, the second must be refused. Raises
        UnfitStore with the reason otherwise (the probe key is deleted either way)."""
        key = f"{self.prefix}{PROBE_KEY}{secrets.token_hex(8)}"
        where = f"S3 endpoint {self.client.meta.endpoint_url}, bucket {self.bucket!r}"
        try:
            for attempt in ("first", "second"):
                try:
                    self.client.put_object(
                        Bucket=self.bucket, Key=key, Body=b"probe", IfNoneMatch="*"
                    )
                except ClientError as err:
                    if attempt == "second" and _code(err) in PRECONDITION_FAILED:
                        return  # refused as it must be
                    raise UnfitStore(
                        f"{where}: a PutObject with If-None-Match: * ({attempt}, on {key}) "
                        f"failed with {_code(err) or err}; the file store needs conditional "
                        "writes (docs/storage.md)"
                    ) from err
            raise UnfitStore(
                f"{where} ignores If-None-Match: * (a second conditional PutObject of {key} "
                "overwrote it instead of answering 412 PreconditionFailed): per-line results "
                "would not be committed exactly once. Use a server with conditional writes "
                "(AWS S3, current MinIO or Ceph RGW; docs/storage.md)"
            )
        finally:
            try:
                self.client.delete_object(Bucket=self.bucket, Key=key)
            except ClientError as err:  # not worth refusing to start over
                log.warning("could not delete the store's probe %s: %s", key, _code(err))

    # ---- keys and plain object operations ------------------------------------------------------
    def _file_key(self, file_id: str, ext: str) -> str:
        if not is_file_id(file_id):
            raise KeyError(file_id)
        return f"{self.prefix}files/{file_id}.{ext}"

    def _batch_key(self, batch_id: str, name: str) -> str:
        if not is_batch_id(batch_id):
            raise KeyError(batch_id)
        return f"{self.prefix}batches/{batch_id}/{name}"

    def _get(self, key: str, range_: str | None = None) -> bytes | None:
        try:
            if range_ is None:
                resp = self.client.get_object(Bucket=self.bucket, Key=key)
            else:
                resp = self.client.get_object(Bucket=self.bucket, Key=key, Range=range_)
        except ClientError as err:
            if _code(err) in NOT_FOUND:
                return None
            raise
        with resp["Body"] as body:
            return body.read()  # type: ignore[no-any-return]

    def _put(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=key, Body=data)

    def _put_first(self, key: str, data: bytes) -> tuple[bytes, bool]:
        """Write `data` unless the key exists: (the stored bytes, True if these are ours)."""
        for attempt in range(CONFLICT_RETRIES):
            try:
                self.client.put_object(Bucket=self.bucket, Key=key, Body=data, IfNoneMatch="*")
                return data, True
            except ClientError as err:
                code = _code(err)
                if code in PRECONDITION_FAILED:
                    existing = self._get(key)
                    if existing is not None:
                        return existing, False
                    continue  # deleted meanwhile (the batch's work dropped): try again
                if code not in CONFLICT:
                    raise
            time.sleep(0.05 * (attempt + 1))
        raise RuntimeError(f"conditional write of {key} kept conflicting")

    def _open(self, key: str) -> BinaryIO | None:
        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=key)
        except ClientError as err:
            if _code(err) in NOT_FOUND:
                return None
            raise
        return io.BufferedReader(_BodyReader(resp["Body"]), READ_BUFFER_BYTES)

    def _exists(self, key: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=key)
        except ClientError as err:
            if _code(err) in NOT_FOUND:
                return False
            raise
        return True

    def _list(self, prefix: str) -> Iterator[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=prefix
        )
        for page in pages:
            for item in page.get("Contents", []):
                yield item["Key"]

    def _delete_keys(self, keys: list[str]) -> None:
        for i in range(0, len(keys), 1000):  # DeleteObjects takes at most 1,000 keys
            batch = [{"Key": k} for k in keys[i : i + 1000]]
            resp = self.client.delete_objects(
                Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True}
            )
            if resp.get("Errors"):
                first = resp["Errors"][0]
                raise RuntimeError(f"delete of {first.get('Key')} failed: {first.get('Code')}")

    # ---- files ------------------------------------------------------------------------------
    def begin_upload(self, max_bytes: int, file_id: str | None = None) -> S3Upload:
        return S3Upload(self, max_bytes, file_id)

    def update_file(self, obj: FileObject) -> None:
        self._put(self._file_key(obj.id, "json"), obj.model_dump_json().encode())

    def get_file(self, file_id: str) -> FileObject | None:
        try:
            data = self._get(self._file_key(file_id, "json"))
        except KeyError:
            return None
        return None if data is None else FileObject.model_validate_json(data)

    def list_files(self, workspace: str | None) -> list[FileObject]:
        keys = [k for k in self._list(f"{self.prefix}files/") if k.endswith(".json")]

        def read(key: str) -> FileObject | None:
            data = self._get(key)
            try:
                return None if data is None else FileObject.model_validate_json(data)
            except ValueError:
                return None

        with ThreadPoolExecutor(LIST_THREADS) as pool:
            found = list(pool.map(read, keys))
        return [f for f in found if f is not None and workspace in (None, f.workspace)]

    def open_file(self, file_id: str) -> BinaryIO:
        try:
            key = self._file_key(file_id, "data")
        except KeyError:
            raise FileNotFoundError(file_id) from None
        f = self._open(key)
        if f is None:
            raise FileNotFoundError(file_id)
        return f

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
            if _code(err) in NOT_FOUND:
                raise FileNotFoundError(file_id) from None
            if _code(err) == "InvalidRange":  # at or past the end
                return io.BytesIO(b"")
            raise
        return io.BufferedReader(_BodyReader(resp["Body"]), READ_BUFFER_BYTES)

    def delete_file(self, file_id: str) -> bool:
        try:
            meta = self._file_key(file_id, "json")
        except KeyError:
            return False
        if not self._exists(meta):
            return False
        self.client.delete_object(Bucket=self.bucket, Key=meta)
        self.client.delete_object(Bucket=self.bucket, Key=self._file_key(file_id, "data"))
        return True

    def keys(self, prefix: str) -> list[str]:
        start = len(self.prefix)
        names = [k[start:] for k in self._list(self.prefix + prefix)]
        names += [f"{key[start:]}#upload" for key, _, _ in self._uploads(self.prefix + prefix)]
        return sorted(names)

    def _uploads(self, prefix: str) -> Iterator[tuple[str, str, float]]:
        """(key, upload id, when begun) of every multipart upload begun and not completed nor
        aborted."""
        pages = self.client.get_paginator("list_multipart_uploads").paginate(
            Bucket=self.bucket, Prefix=prefix
        )
        for page in pages:
            for item in page.get("Uploads", []):
                yield item["Key"], item["UploadId"], item["Initiated"].timestamp()

    def _parts(self, key: str, upload_id: str) -> list[dict[str, Any]] | None:
        """The parts a multipart upload holds so far; None if it is finished or aborted."""
        parts: list[dict[str, Any]] = []
        try:
            pages = self.client.get_paginator("list_parts").paginate(
                Bucket=self.bucket, Key=key, UploadId=upload_id
            )
            for page in pages:
                parts += page.get("Parts", [])
        except ClientError as err:
            if _code(err) != "NoSuchUpload":
                raise
            return None
        return parts

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
                if _code(err) != "NoSuchUpload":  # finished or aborted meanwhile
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
            if _code(err) in NOT_FOUND:
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

    def drop_finalized_leftovers(self) -> int:
        """One listing of `batches/` in key order, where a batch's `finalized.json` comes
        before its other keys (`index.json`, `input.jsonl`, `lengths.bin`, `offsets.bin`,
        `results/`, `route-<n>.bin` all sort after it): the keys after it are leftovers,
        deleted 1,000 a call. A batch whose first key is another is not finalized, and the
        listing skips its keys (it starts again after `<batch id>0`: no character sorts
        between `/` and `0`), so a running batch's results cost one listing, not one a
        thousand keys."""
        base = f"{self.prefix}batches/"
        after = ""
        current, finalized = "", False
        leftovers: list[str] = []
        swept: set[str] = set()
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
                    if not finalized:
                        skip_to = f"{base}{batch_id}0"
                        break
                elif finalized:
                    leftovers.append(key)
                    swept.add(batch_id)
            if skip_to is not None:
                after = skip_to
            elif contents and page.get("IsTruncated"):
                after = contents[-1]["Key"]
            else:
                break
            if len(leftovers) >= 1000:
                self._delete_keys(leftovers)
                leftovers = []
        self._delete_keys(leftovers)
        with self._lock:
            for cache_key in [k for k in self._blocks if k[0] in swept]:
                del self._blocks[cache_key]
        return len(swept)

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

    def _partial_key(self, batch_id: str, line_no: int) -> str:
        return self._batch_key(batch_id, f"partials/{line_no // 1000:05d}/{line_no}.json")

    def put_partial(self, batch_id: str, line_no: int, data: bytes) -> None:
        self._put(self._partial_key(batch_id, line_no), data)

    def get_partial(self, batch_id: str, line_no: int) -> bytes | None:
        return self._get(self._partial_key(batch_id, line_no))


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
                if _code(err) != "NoSuchUpload":
                    raise


class _BodyReader(io.RawIOBase):
    """A GetObject body as a raw stream (wrapped in a BufferedReader by `S3Store._open`)."""

    def __init__(self, body: Any) -> None:
        self._body = body

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        data = self._body.read(len(b))
        n = len(data)
        b[:n] = data
        return n

    def close(self) -> None:
        if not self.closed:
            self._body.close()
        super().close()


def _iter_array(f: BinaryIO, typecode: str) -> Iterator[int]:
    """The values of a streamed array file, one block at a time."""
    itemsize = array(typecode).itemsize
    while data := f.read(INDEX_BLOCK_ENTRIES * itemsize):
        values = array(typecode)
        values.frombytes(data)
        yield from values
