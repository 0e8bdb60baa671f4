"""A file's upload to the S3 store: up to one part in memory, then a multipart upload."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from backfill.files.base import FileObject, Upload
from backfill.files.s3_objects import _code
from backfill.platform.ids import new_file_id

if TYPE_CHECKING:
    from backfill.files.s3 import S3Store


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
