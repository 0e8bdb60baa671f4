"""The file store: uploads, batch line indexes, per-line result records, assembled outputs.

`Store` (`backfill.files.base`) is the interface every caller uses; it hands out streams,
iterators and bytes, never a filesystem path, so the api and the workers run the same way on
either store:

- `FileStore` (`backfill.files.local`; the default, `BACKFILL_STORE=local`): a local directory
  (one host, or several hosts on a shared volume).
- `S3Store` (`backfill.files.s3`; `BACKFILL_STORE=s3`): any S3-compatible object store
  (docs/storage.md, docs/decisions/0013-s3-store.md).

On both, per-line results are committed first-writer-wins: a line that ran twice (a worker died
after writing) keeps its first record, so it is committed exactly once. `open_store(settings)`
makes the configured one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from backfill.files.base import (
    ABANDONED_UPLOAD_SECONDS,
    CHUNK_BYTES,
    FINALIZED,
    BatchFinalized,
    FileObject,
    FileTooLarge,
    RouteLines,
    Store,
    Upload,
    chunks,
    has_expired,
    index_meta,
)
from backfill.files.local import FileStore, FileUpload

if TYPE_CHECKING:
    from backfill.platform.config import Settings

__all__ = [
    "ABANDONED_UPLOAD_SECONDS",
    "CHUNK_BYTES",
    "BatchFinalized",
    "FINALIZED",
    "FileObject",
    "FileStore",
    "FileTooLarge",
    "FileUpload",
    "RouteLines",
    "Store",
    "Upload",
    "chunks",
    "has_expired",
    "index_meta",
    "open_store",
]


def open_store(settings: Settings) -> Store:
    """The store the settings name: the local directory `data_dir`, or an S3 bucket."""
    if settings.store == "s3":
        from backfill.files.s3 import S3Store  # boto3 is imported only where it is used

        return S3Store.from_settings(settings)
    return FileStore(settings.data_dir)
