"""The S3 store's bucket: plain object operations on one bucket under a prefix, the boto3 client
a store is built with, and the check that the endpoint keeps conditional writes.

`backfill.files.s3.S3Store` builds the `Store` interface on these (files, batches, results),
and its `S3Upload` sends a file's parts. Every error code S3-compatible servers answer with is
read here (`error_code`) and only here.
"""

from __future__ import annotations

import io
import logging
import secrets
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, BinaryIO

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

if TYPE_CHECKING:
    from backfill.platform.config import Settings

log = logging.getLogger(__name__)

READ_BUFFER_BYTES = 1 << 20
"""Read-ahead of a streamed object (validation, finalizing, downloads)."""
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


def error_code(err: ClientError) -> str:
    return str(err.response.get("Error", {}).get("Code", ""))


def s3_client(settings: Settings) -> Any:
    """The boto3 client the settings describe (AWS, or an S3-compatible endpoint)."""
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
    return boto3.session.Session().client(
        "s3",
        endpoint_url=settings.s3_endpoint_url,
        region_name=settings.s3_region,
        config=config,
    )


class S3Objects:
    """One bucket under a prefix: get, put, put-if-absent, stream, list, delete, and the
    multipart uploads begun there."""

    def __init__(self, client: Any, bucket: str, prefix: str = "") -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = prefix

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
                    if attempt == "second" and error_code(err) in PRECONDITION_FAILED:
                        return  # refused as it must be
                    raise UnfitStore(
                        f"{where}: a PutObject with If-None-Match: * ({attempt}, on {key}) "
                        f"failed with {error_code(err) or err}; the file store needs conditional "
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
                log.warning("could not delete the store's probe %s: %s", key, error_code(err))

    def _get(self, key: str, range_: str | None = None) -> bytes | None:
        try:
            if range_ is None:
                resp = self.client.get_object(Bucket=self.bucket, Key=key)
            else:
                resp = self.client.get_object(Bucket=self.bucket, Key=key, Range=range_)
        except ClientError as err:
            if error_code(err) in NOT_FOUND:
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
                code = error_code(err)
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
            if error_code(err) in NOT_FOUND:
                return None
            raise
        return io.BufferedReader(BodyReader(resp["Body"]), READ_BUFFER_BYTES)

    def _exists(self, key: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=key)
        except ClientError as err:
            if error_code(err) in NOT_FOUND:
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
            if error_code(err) != "NoSuchUpload":
                raise
            return None
        return parts


class BodyReader(io.RawIOBase):
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
