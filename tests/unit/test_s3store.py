"""The store interface on both stores, and the S3 store against a real S3 API (moto's server on
loopback): conditional first-writer-wins commits under concurrent writers, multipart uploads,
ranged line reads, streamed reads, listing, expiry and dropping a batch's work."""

from __future__ import annotations

import secrets
import threading
from array import array
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from backfill.config import Settings
from backfill.store import FileStore, FileTooLarge, RouteLines, Store, chunks, open_store
from backfill.store.s3 import S3Store
from tests.s3server import BUCKET, CREDENTIALS, client, threaded_moto

MiB = 1 << 20
PART = 5 * MiB


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    with threaded_moto() as url:
        yield url


@pytest.fixture
def s3(moto_url: str) -> S3Store:
    """A store of its own: a fresh prefix in the shared bucket."""
    return S3Store(client(moto_url), BUCKET, f"t-{secrets.token_hex(4)}/", part_bytes=PART)


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "local":
        return FileStore(tmp_path / "store")
    return request.getfixturevalue("s3")  # type: ignore[no-any-return]


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


# ---- the interface, on both stores ---------------------------------------------------------------


def test_upload_read_list_and_delete(store: Store) -> None:
    data = b'{"a": 1}\n\x00\xff'
    file_id = upload(store, data, workspace="alpha")
    other = upload(store, b"x", workspace="beta")
    meta = store.get_file(file_id)
    assert meta is not None and (meta.bytes, meta.workspace, meta.created_at) == (
        len(data),
        "alpha",
        1000,
    )
    assert store.read_file(file_id) == data
    assert b"".join(chunks(store.open_file(file_id), 3)) == data
    assert [f.id for f in store.list_files("alpha")] == [file_id]
    assert {f.id for f in store.list_files(None)} == {file_id, other}
    assert store.delete_file(file_id) and not store.delete_file(file_id)
    assert store.get_file(file_id) is None
    with pytest.raises(FileNotFoundError):
        store.open_file(file_id)
    assert store.keys("files/") == sorted([f"files/{other}.data", f"files/{other}.json"])


def test_bad_ids_are_refused_not_followed(store: Store) -> None:
    assert store.get_file("../../etc/passwd") is None
    assert not store.delete_file("../x")
    with pytest.raises(FileNotFoundError):
        store.open_file("../x")
    with pytest.raises(KeyError):
        store.commit_result("../x", 0, b"")


def test_the_cap_is_enforced_while_streaming_and_abort_leaves_nothing(store: Store) -> None:
    up = store.begin_upload(PART + 10)
    up.write(b"x" * (PART + 10))
    with pytest.raises(FileTooLarge):
        up.write(b"y")
    up.abort()
    up.abort()  # harmless again
    assert store.keys("files/") == [] and store.pending_uploads() == {}


def test_first_result_wins(store: Store) -> None:
    assert store.commit_result("batch_x", 0, b"first") == (b"first", True)
    assert store.commit_result("batch_x", 0, b"second") == (b"first", False)
    assert store.get_result("batch_x", 0) == b"first"
    assert store.get_result("batch_x", 1) is None


def test_lines_by_index_from_the_pinned_input(store: Store) -> None:
    data = b'{"custom_id":"a"}\n\n{"custom_id":"bb"}\n{"custom_id":"c"}'
    file_id = upload(store, data)
    store.snapshot_input("batch_y", file_id)
    store.snapshot_input("batch_y", file_id)  # again: harmless
    index(store, "batch_y", data)
    assert store.delete_file(file_id)  # the user's right: the batch reads its pinned copy
    assert store.index_total("batch_y") == 3
    assert store.read_line("batch_y", file_id, 1) == b'{"custom_id":"bb"}'
    assert [store.line_number("batch_y", 0, p) for p in range(3)] == [2, 1, 0]
    assert list(store.iter_lines("batch_y", file_id)) == [
        (0, b'{"custom_id":"a"}'),
        (1, b'{"custom_id":"bb"}'),
        (2, b'{"custom_id":"c"}'),
    ]
    with store.open_input("batch_y", file_id) as f:
        assert f.read() == data


def test_an_unpinned_batch_reads_the_upload(store: Store) -> None:
    data = b'{"custom_id":"a"}\n{"custom_id":"b"}\n'
    file_id = upload(store, data)
    index(store, "batch_old", data)
    assert store.read_line("batch_old", file_id, 1) == b'{"custom_id":"b"}'
    assert [raw for _, raw in store.iter_lines("batch_old", file_id)] == data.split(b"\n")[:2]


def test_drop_batch_work_keeps_only_the_finalized_record(store: Store) -> None:
    file_id = upload(store, b'{"a":1}\n')
    store.snapshot_input("batch_z", file_id)
    index(store, "batch_z", b'{"a":1}\n')
    store.commit_result("batch_z", 0, b"{}")
    store.write_finalized("batch_z", b'{"total": 1}')
    store.drop_batch_work("batch_z")
    store.drop_batch_work("batch_z")
    assert store.keys("batches/batch_z/") == ["batches/batch_z/finalized.json"]
    assert store.read_finalized("batch_z") == b'{"total": 1}'
    assert store.read_file(file_id) == b'{"a":1}\n'  # the upload is the user's


def test_expired_files_and_update(store: Store) -> None:
    short = upload(store, b"a", expires=3600)
    upload(store, b"b")
    assert [f.id for f in store.expired_files(4599)] == []
    assert [f.id for f in store.expired_files(4600)] == [short]
    meta = store.get_file(short)
    assert meta is not None
    store.update_file(meta.model_copy(update={"expires_at": 2000}))
    assert [f.id for f in store.expired_files(2000)] == [short]


def test_a_multipart_sized_upload_round_trips(store: Store) -> None:
    data = secrets.token_bytes(2 * PART + 12345)
    file_id = upload(store, data)
    assert store.read_file(file_id) == data
    assert b"".join(chunks(store.open_file(file_id))) == data
    assert store.pending_uploads() == {}


# ---- S3 specifics --------------------------------------------------------------------------------


def test_concurrent_writers_of_one_line_exactly_one_wins(s3: S3Store) -> None:
    """Real concurrency against the S3 API: 16 threads released at once, each committing its
    own record for the same line. Exactly one is told it committed; all get its record."""
    writers = 16
    start = threading.Barrier(writers)
    results: list[tuple[bytes, bool]] = []
    lock = threading.Lock()

    def commit(i: int) -> None:
        start.wait()
        got = s3.commit_result("batch_race", 7, f"writer-{i}".encode())
        with lock:
            results.append(got)

    threads = [threading.Thread(target=commit, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [rec for rec, mine in results if mine]
    assert len(results) == writers and len(winners) == 1
    assert {rec for rec, _ in results} == set(winners)
    assert s3.get_result("batch_race", 7) == winners[0]


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


def test_settle_results_fills_the_missing_lines_in_order(store: Store) -> None:
    lines = [f'{{"custom_id":"{i}"}}'.encode() for i in range(300)]
    file_id = indexed_batch(store, "batch_set", lines)
    for n in range(0, 300, 3):
        store.commit_result("batch_set", n, b"ran-%d" % n)
    settled = list(store.settle_results("batch_set", file_id, lambda n, raw: b"filled-" + raw))
    assert [(n, raw) for n, raw, _ in settled] == list(enumerate(lines))
    assert [rec for _, _, rec in settled] == [
        b"ran-%d" % n if n % 3 == 0 else b"filled-" + lines[n] for n in range(300)
    ]
    # The fills are committed: a late writer of such a line loses to them.
    assert store.commit_result("batch_set", 1, b"late") == (b"filled-" + lines[1], False)
