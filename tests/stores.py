"""Helpers for the store tests (tests/unit/test_store_*.py): upload a file, write a batch's line
index as validation does, record the S3 requests a store sends. The fixtures (`moto_url`, `s3`)
are in tests/unit/conftest.py."""

from __future__ import annotations

import secrets
from array import array
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast

from backfill.files import RouteLines, Store

if TYPE_CHECKING:
    from backfill.files.s3 import S3Store

MiB = 1 << 20
PART = 5 * MiB
"""The S3 store's part size in these tests (S3's smallest)."""


def s3_store(moto_url: str) -> S3Store:
    """A store of its own: a fresh prefix in the shared bucket."""
    from backfill.files.s3 import S3Store  # boto3 only where S3 is tested
    from tests.s3server import BUCKET, client

    return S3Store(client(moto_url), BUCKET, f"t-{secrets.token_hex(4)}/", part_bytes=PART)


def upload(store: Store, data: bytes, *, workspace: str = "w", expires: int | None = None) -> str:
    up = store.begin_upload(1 << 30)
    for i in range(0, len(data), MiB):
        up.write(data[i : i + MiB])
    obj = up.finish(
        workspace=workspace, filename="in.jsonl", purpose="batch", now=1000, expires_after=expires
    )
    return obj.id


def index(store: Store, batch_id: str, data: bytes) -> None:
    """The line index of `data` (non-empty lines), all lines on one route in reverse order."""
    offsets, lengths = array("Q"), array("I")
    pos = 0
    for line in data.split(b"\n"):
        if line:
            offsets.append(pos)
            lengths.append(len(line))
        pos += len(line) + 1
    n = len(offsets)
    store.write_index(
        batch_id, offsets, lengths, [RouteLines("r", "m", n)], [array("I", range(n - 1, -1, -1))]
    )


def indexed_batch(store: Store, batch_id: str, lines: list[bytes]) -> str:
    """Upload `lines` as a file, pin it as the batch's input and index it; the file's id."""
    data = b"\n".join(lines) + b"\n"
    file_id = upload(store, data)
    store.snapshot_input(batch_id, file_id)
    index(store, batch_id, data)
    return file_id


@contextmanager
def recorded(s3: S3Store, operation: str) -> Iterator[list[dict[str, Any]]]:
    """The parameters of every `operation` (e.g. "GetObject") the store's client sends in the
    block, in order."""
    calls: list[dict[str, Any]] = []

    def record(params: dict[str, Any], **_: Any) -> None:
        calls.append(params)

    event = f"provide-client-params.s3.{operation}"
    s3.client.meta.events.register(event, record)
    try:
        yield calls
    finally:
        s3.client.meta.events.unregister(event, record)


@contextmanager
def metadata_reads(store: Store) -> Iterator[list[str]]:
    """The ids of the files whose metadata (`files/<id>.json`) the store reads in the block,
    from the storage itself: the S3 store's GetObject requests, the local store's reads of
    its directory."""
    from pathlib import Path

    from backfill.files import FileStore

    if isinstance(store, FileStore):
        read: list[str] = []
        original = Path.read_bytes

        def read_bytes(path: Path) -> bytes:
            if path.parent == store.root / "files" and path.suffix == ".json":
                read.append(path.stem)
            return original(path)

        Path.read_bytes = read_bytes  # type: ignore[method-assign, assignment]
        try:
            yield read
        finally:
            Path.read_bytes = original  # type: ignore[method-assign]
        return
    with recorded(store, "GetObject") as calls:  # type: ignore[arg-type]
        ids: list[str] = []
        yield ids
    ids += [
        c["Key"].rsplit("/", 1)[1].removesuffix(".json")
        for c in calls
        if c["Key"].endswith(".json") and "/files/file-" in "/" + c["Key"]
    ]


def unindex(store: Store) -> None:
    """Make the store look as an earlier version left it: files, and no workspace index."""
    import shutil

    from backfill.files import FileStore

    if isinstance(store, FileStore):
        shutil.rmtree(store.root / "workspaces")
        store._index_seen = False
        return
    s3 = cast("S3Store", store)
    s3._delete_keys(list(s3._list(f"{s3.prefix}workspaces/")))
    s3._index_seen = False
