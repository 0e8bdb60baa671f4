"""The S3 store's own behaviour against a real S3 API (moto's server on loopback): the
finalized record kept first by a conditional put, multipart uploads, outputs named at begin or
at finish, ranged line reads through cached index blocks, dropping more than one
`DeleteObjects` call's keys, and `open_store`. What every store does is in
test_store_contract.py (which runs the S3 store too)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from backfill.files import FileStore, open_store
from backfill.files.s3 import PROBE_KEY, S3Store, UnfitStore
from backfill.platform.config import Settings
from tests.s3server import BUCKET, CREDENTIALS
from tests.stores import PART, indexed_batch, recorded, upload


def test_concurrent_finalized_writes_keep_the_first(s3: S3Store) -> None:
    start = threading.Barrier(8)

    def write(i: int) -> None:
        start.wait()
        s3.write_finalized("batch_fin", f"run-{i}".encode())

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    first = s3.read_finalized("batch_fin")
    assert first is not None and first.startswith(b"run-")
    s3.write_finalized("batch_fin", b"later")
    assert s3.read_finalized("batch_fin") == first


def test_a_big_upload_goes_in_parts_and_is_visible_only_when_finished(s3: S3Store) -> None:
    up = s3.begin_upload(1 << 30)
    up.write(b"a" * (PART - 1))
    assert s3.pending_uploads() == {}  # less than a part: still in memory
    up.write(b"b" * 2)  # one part full: sent, one byte held back
    [(name, held)] = s3.pending_uploads().items()
    assert held == PART and name.startswith("files/")
    assert s3.keys("files/") == [name.split("#")[0] + "#upload"]
    obj = up.finish(workspace="w", filename="big.jsonl", purpose="batch")
    assert obj.bytes == PART + 1
    assert s3.pending_uploads() == {}
    assert s3.read_file(obj.id) == b"a" * (PART - 1) + b"bb"
    up.abort()  # after finish: nothing to abort, the file stays
    assert s3.get_file(obj.id) is not None


def test_an_aborted_multipart_upload_leaves_nothing(s3: S3Store) -> None:
    up = s3.begin_upload(1 << 30)
    up.write(b"x" * (3 * PART))
    assert len(s3.pending_uploads()) == 1
    up.abort()
    assert s3.pending_uploads() == {} and s3.keys("files/") == []


def test_an_output_named_at_finish_lands_under_that_id(s3: S3Store) -> None:
    up = s3.begin_upload(1 << 30)
    up.write(b"y" * (PART + 1))
    with recorded(s3, "CopyObject") as copies:
        obj = up.finish(
            workspace="w", filename="o.jsonl", purpose="batch_output", file_id="file-out1"
        )
    assert len(copies) == 1  # uploaded under a fresh id, then copied to its name
    assert obj.id == "file-out1"
    assert s3.read_file("file-out1") == b"y" * (PART + 1)
    assert s3.keys("files/") == ["files/file-out1.data", "files/file-out1.json"]


def test_an_output_named_at_begin_needs_no_copy(s3: S3Store) -> None:
    with recorded(s3, "CopyObject") as copies:
        up = s3.begin_upload(1 << 30, file_id="file-out2")
        up.write(b"z" * (PART + 1))
        up.finish(workspace="w", filename="o.jsonl", purpose="batch_output", file_id="file-out2")
    assert copies == []
    assert s3.read_file("file-out2") == b"z" * (PART + 1)


def test_a_line_read_is_a_ranged_read_never_the_whole_input(s3: S3Store) -> None:
    lines = [f'{{"custom_id":"{i}","pad":"{"p" * 100}"}}'.encode() for i in range(20_000)]
    file_id = indexed_batch(s3, "batch_rng", lines)
    data = b"\n".join(lines) + b"\n"  # where each line sits, for the expected ranges
    with recorded(s3, "GetObject") as gets:
        assert s3.read_line("batch_rng", file_id, 12_345) == lines[12_345]
        assert s3.read_line("batch_rng", file_id, 12_346) == lines[12_346]
    assert gets and all("Range" in g for g in gets), gets
    inputs = [g for g in gets if g["Key"].endswith("input.jsonl")]
    assert [g["Range"] for g in inputs] == [
        f"bytes={data.index(lines[n])}-{data.index(lines[n]) + len(lines[n]) - 1}"
        for n in (12_345, 12_346)
    ]
    # The second line's offsets and lengths came from the cached index blocks.
    assert len(gets) == 4, [g["Key"] for g in gets]
    assert [raw for _, raw in s3.iter_lines("batch_rng", file_id)] == lines


@pytest.mark.scale  # S3's DeleteObjects takes 1,000 keys: the size is the subject
def test_dropping_a_batch_of_more_than_1000_results(s3: S3Store) -> None:
    for line in range(1005):
        s3.commit_result("batch_many", line, b"{}")
    s3.write_finalized("batch_many", b"{}")
    s3.drop_batch_work("batch_many")
    assert s3.keys("batches/batch_many/") == ["batches/batch_many/finalized.json"]


def test_open_store_picks_the_configured_store(
    moto_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    local = open_store(Settings(data_dir=tmp_path))
    assert isinstance(local, FileStore)
    settings = Settings(
        data_dir=tmp_path,
        store="s3",
        s3_bucket=BUCKET,
        s3_prefix="factory/",
        s3_endpoint_url=moto_url,
        s3_region="us-east-1",
    )
    remote = open_store(settings)
    assert isinstance(remote, S3Store) and remote.prefix == "factory/"
    file_id = upload(remote, b"hello")
    assert remote.read_file(file_id) == b"hello"


def test_s3_needs_a_bucket() -> None:
    with pytest.raises(ValueError, match="BACKFILL_S3_BUCKET"):
        Settings(store="s3")


def test_the_endpoint_is_checked_for_conditional_writes(s3: S3Store) -> None:
    s3.check_conditional_writes()  # moto answers the second conditional put with 412
    assert s3.keys("") == []  # the probe is gone


class StubS3:
    """An S3 client for the refusals: puts answer `answer` (None: 200, whatever the headers,
    as a server ignoring If-None-Match does); every key put and deleted is recorded."""

    class meta:
        endpoint_url = "http://stub.invalid"

    def __init__(self, answer: str | None = None) -> None:
        self.answer = answer
        self.puts: list[dict[str, Any]] = []
        self.deleted: list[str] = []

    def put_object(self, **params: Any) -> dict[str, Any]:
        self.puts.append(params)
        if self.answer is not None:
            error = {"Error": {"Code": self.answer, "Message": "stub"}}
            raise ClientError(error, "PutObject")  # type: ignore[arg-type]
        return {}

    def delete_object(self, **params: Any) -> dict[str, Any]:
        self.deleted.append(params["Key"])
        return {}


@pytest.mark.parametrize(
    ("answer", "reason"),
    [(None, "ignores If-None-Match"), ("NotImplemented", "failed with NotImplemented")],
    ids=["ignored", "refused"],
)
def test_an_endpoint_without_conditional_writes_is_refused_at_start(
    answer: str | None, reason: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`open_store` (the api's and the worker's start) refuses, saying why."""
    stub = StubS3(answer)
    monkeypatch.setattr(boto3.session.Session, "client", lambda *a, **kw: stub)
    settings = Settings(data_dir=tmp_path, store="s3", s3_bucket="b", s3_prefix="p/")
    with pytest.raises(UnfitStore, match=reason):
        open_store(settings)
    assert stub.puts and all(p["IfNoneMatch"] == "*" for p in stub.puts)
    assert stub.deleted == [stub.puts[0]["Key"]]
    assert stub.deleted[0].startswith(f"p/{PROBE_KEY}")
