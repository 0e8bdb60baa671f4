"""The store contract: what every `Store` must do, run against each store (the local directory
on tmp_path, and S3 against moto's server on loopback). A new backend joins `STORES` and must
pass all of it. What only one store does is tested in test_store_local.py and test_store_s3.py.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from pathlib import Path

import pytest

from activities.retention import RetentionActivities, drop_ended_work
from backfill.files import (
    ABANDONED_UPLOAD_SECONDS,
    BatchFinalized,
    FileStore,
    FileTooLarge,
    Store,
    chunks,
)
from backfill.platform.ids import new_batch_id
from tests.stores import PART, index, indexed_batch, metadata_reads, unindex, upload

STORES = ["local", "s3"]


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "local":
        return FileStore(tmp_path / "store")
    return request.getfixturevalue("s3")  # type: ignore[no-any-return]


# ---- files -----------------------------------------------------------------------------------


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


def test_a_file_opens_from_an_offset(store: Store) -> None:
    data = b"first\nsecond\nthird\n"
    file_id = upload(store, data)
    for offset in (0, 6, len(data) - 1, len(data), len(data) + 5):
        with store.open_file_from(file_id, offset) as f:
            assert f.read() == data[offset:], offset
    with pytest.raises(FileNotFoundError):
        store.open_file_from("file-missing", 3)


def test_ids_outside_the_store_are_refused(store: Store) -> None:
    assert store.get_file("../../etc/passwd") is None
    assert not store.delete_file("../x")
    with pytest.raises(FileNotFoundError):
        store.open_file("../x")
    with pytest.raises(KeyError):
        store.commit_result("../x", 0, b"")


@pytest.mark.parametrize("cap", [10, PART + 10], ids=["in-memory", "a-part-sent"])
def test_the_cap_is_enforced_while_streaming_and_abort_leaves_nothing(
    store: Store, cap: int
) -> None:
    up = store.begin_upload(cap)
    up.write(b"x" * cap)
    with pytest.raises(FileTooLarge):
        up.write(b"y")
    up.abort()
    up.abort()  # harmless again
    assert store.keys("files/") == [] and store.pending_uploads() == {}


def test_an_upload_is_pending_until_finished_and_visible_only_then(store: Store) -> None:
    up = store.begin_upload(1 << 30)
    up.write(b"a" * (2 * PART))
    up.write(b"b")
    [held] = store.pending_uploads().values()
    assert 2 * PART <= held <= 2 * PART + 1  # a store may hold the last bytes in memory
    assert len(store.keys("files/")) == 1 and store.list_files(None) == []
    obj = up.finish(workspace="w", filename="big.jsonl", purpose="batch")
    assert store.pending_uploads() == {}
    assert store.keys("files/") == [f"files/{obj.id}.data", f"files/{obj.id}.json"]
    assert store.read_file(obj.id) == b"a" * (2 * PART) + b"b"
    up.abort()  # after finish: nothing to abort, the file stays
    assert store.get_file(obj.id) == obj


def test_an_upload_its_process_abandoned_is_dropped_by_the_retention_pass(store: Store) -> None:
    kept = upload(store, b"kept")
    up = store.begin_upload(1 << 30)
    up.write(b"a" * (PART + 1))  # on S3, one part sent: a multipart upload begun
    # Its process dies here: nobody finishes nor aborts the upload.
    assert len(store.pending_uploads()) == 1
    retention = RetentionActivities(store)
    assert retention._delete_expired(int(time.time())).abandoned_uploads == 0  # not a day old
    assert len(store.pending_uploads()) == 1
    a_day_on = int(time.time()) + ABANDONED_UPLOAD_SECONDS + 1
    assert retention._delete_expired(a_day_on).abandoned_uploads == 1
    assert store.pending_uploads() == {}
    assert store.keys("files/") == [f"files/{kept}.data", f"files/{kept}.json"]
    assert store.read_file(kept) == b"kept"
    assert store.drop_abandoned_uploads(time.time() + 1) == 0  # nothing more to drop
    up.abort()  # the dead process's handle, had it lived: harmless


def test_a_multipart_sized_upload_round_trips(store: Store) -> None:
    data = secrets.token_bytes(2 * PART + 12345)
    file_id = upload(store, data)
    assert store.read_file(file_id) == data
    assert b"".join(chunks(store.open_file(file_id))) == data
    assert store.pending_uploads() == {}


def test_an_output_named_at_finish_replaces_the_file_of_that_id(store: Store) -> None:
    for content in (b"first run\n", b"second run\n"):
        up = store.begin_upload(1 << 30)
        up.write(content)
        obj = up.finish(
            workspace="w", filename="o.jsonl", purpose="batch_output", file_id="file-out"
        )
        assert obj.id == "file-out"
    assert store.read_file("file-out") == b"second run\n"
    assert store.keys("files/") == ["files/file-out.data", "files/file-out.json"]


def test_expired_files_and_update(store: Store) -> None:
    short = upload(store, b"a", expires=3600)
    upload(store, b"b")
    assert [f.id for f in store.expired_files(4599)] == []
    assert [f.id for f in store.expired_files(4600)] == [short]
    meta = store.get_file(short)
    assert meta is not None
    store.update_file(meta.model_copy(update={"expires_at": 2000}))
    assert [f.id for f in store.expired_files(2000)] == [short]
    assert store.read_file(short) == b"a"  # the content is unchanged


def test_listing_a_workspace_reads_none_of_another_workspaces_files(store: Store) -> None:
    assert store.list_files("alpha") == []  # a new store (on S3 its first listing marks it)
    mine = {upload(store, b"a", workspace="alpha") for _ in range(3)}
    theirs = {upload(store, b"b", workspace="beta") for _ in range(5)}
    with metadata_reads(store) as read:
        listed = {f.id for f in store.list_files("alpha")}
    assert listed == mine
    assert set(read) == mine, "alpha's listing read beta's files"
    assert {f.id for f in store.list_files(None)} == mine | theirs
    gone = mine.pop()
    assert store.delete_file(gone)
    with metadata_reads(store) as read:
        assert {f.id for f in store.list_files("alpha")} == mine
    assert not set(read) & theirs


def test_a_store_from_before_the_index_is_indexed_on_its_first_listing(store: Store) -> None:
    mine = {upload(store, b"a", workspace="alpha") for _ in range(2)}
    theirs = upload(store, b"b", workspace="beta")
    unindex(store)  # as an earlier version left it
    with metadata_reads(store) as read:
        assert {f.id for f in store.list_files("alpha")} == mine  # every file read, once
    assert theirs in read
    with metadata_reads(store) as read:
        assert {f.id for f in store.list_files("alpha")} == mine
        assert [f.id for f in store.list_files("beta")] == [theirs]
    assert set(read) == mine | {theirs}  # each through its own workspace's index


def test_the_retention_pass_indexes_a_file_an_earlier_version_wrote(store: Store) -> None:
    store.list_files("alpha")  # the store is indexed
    late = upload(store, b"a", workspace="alpha")
    unindex(store)  # a process of the earlier version wrote it (a rolling upgrade)
    store._index_mark()  # the mark stays: only that file lacks its entry
    assert store.list_files("alpha") == []
    out = RetentionActivities(store)._delete_expired(int(time.time()))
    assert out.indexed_files == 1
    assert [f.id for f in store.list_files("alpha")] == [late]
    assert RetentionActivities(store)._delete_expired(int(time.time())).indexed_files == 0


# ---- batches: pinned input and line index --------------------------------------------------------


def test_index_and_pinned_input_survive_deleting_the_upload(store: Store) -> None:
    data = b'{"custom_id":"a"}\n\n{"custom_id":"bb"}\n{"custom_id":"c"}'
    file_id = upload(store, data)
    store.snapshot_input("batch_y", file_id)
    store.snapshot_input("batch_y", file_id)  # again: harmless
    index(store, "batch_y", data)
    assert store.delete_file(file_id)  # the user's right: the batch reads its pinned copy
    assert store.get_file(file_id) is None
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


def test_pinning_a_missing_file_is_refused(store: Store) -> None:
    with pytest.raises(FileNotFoundError):
        store.snapshot_input("batch_gone", "file-nosuchfile")


def test_a_batch_without_an_index_reads_no_lines(store: Store) -> None:
    with pytest.raises(FileNotFoundError):
        store.index_total("batch_none")
    with pytest.raises(FileNotFoundError):
        store.line_number("batch_none", 0, 0)


# ---- batches: per-line results -------------------------------------------------------------------


def test_first_result_wins(store: Store) -> None:
    assert store.commit_result("batch_x", 0, b"first") == (b"first", True)
    assert store.commit_result("batch_x", 0, b"second") == (b"first", False)
    assert store.get_result("batch_x", 0) == b"first"
    assert store.get_result("batch_x", 1) is None
    # nothing but the record is left behind (no temp files)
    assert store.keys("batches/batch_x/") == ["batches/batch_x/results/00000/0.json"]


def test_concurrent_writers_of_one_line_exactly_one_wins(store: Store) -> None:
    """Real concurrency: 16 threads released at once, each committing its own record for the
    same line. Exactly one is told it committed; all get its record. (On S3 this is how to
    check a server enforces `If-None-Match: *`: one that ignores it fails here.)"""
    writers = 16
    start = threading.Barrier(writers)
    results: list[tuple[bytes, bool]] = []
    lock = threading.Lock()

    def commit(i: int) -> None:
        start.wait()
        got = store.commit_result("batch_race", 7, f"writer-{i}".encode())
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
    assert store.get_result("batch_race", 7) == winners[0]


def test_settle_results_fills_the_missing_lines_in_order(store: Store) -> None:
    lines = [f'{{"custom_id":"{i}"}}'.encode() for i in range(30)]
    file_id = indexed_batch(store, "batch_set", lines)
    for n in range(0, 30, 3):
        store.commit_result("batch_set", n, b"ran-%d" % n)
    settled = list(store.settle_results("batch_set", file_id, lambda n, raw: b"filled-" + raw))
    assert [(n, raw) for n, raw, _ in settled] == list(enumerate(lines))
    assert [rec for _, _, rec in settled] == [
        b"ran-%d" % n if n % 3 == 0 else b"filled-" + lines[n] for n in range(30)
    ]
    # The fills are committed: a late writer of such a line loses to them.
    assert store.commit_result("batch_set", 1, b"late") == (b"filled-" + lines[1], False)


# ---- batches: the end ----------------------------------------------------------------------------


def test_the_finalized_record(store: Store) -> None:
    assert store.read_finalized("batch_f") is None
    store.write_finalized("batch_f", b'{"total": 2}')
    assert store.read_finalized("batch_f") == b'{"total": 2}'
    # Finalizing reads first and writes only when there is none; a racing second run writes
    # the same counts, so a store may keep either record, whole.
    store.write_finalized("batch_f", b'{"total": 2, "run": 2}')
    assert store.read_finalized("batch_f") in (b'{"total": 2}', b'{"total": 2, "run": 2}')
    with pytest.raises(KeyError):
        store.write_finalized("../x", b"{}")


def test_a_partial_answer_is_replaced_whole_and_dropped_with_the_batch(store: Store) -> None:
    assert store.get_partial("batch_p", 3) is None
    store.put_partial("batch_p", 3, b'{"text": "Once"}')
    store.put_partial("batch_p", 3, b'{"text": "Once upon"}')
    assert store.get_partial("batch_p", 3) == b'{"text": "Once upon"}'
    assert store.get_partial("batch_p", 4) is None
    assert store.keys("batches/batch_p/") == ["batches/batch_p/partials/00000/3.json"]
    store.drop_batch_work("batch_p")
    assert store.get_partial("batch_p", 3) is None
    with pytest.raises(KeyError):
        store.put_partial("../x", 0, b"{}")


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
    store.drop_batch_work("batch_never")  # nothing stored: harmless


def test_a_dropped_batch_reads_no_lines_even_through_what_the_store_keeps(store: Store) -> None:
    """Local: kept read handles; S3: cached index blocks. Neither outlives the drop."""
    file_id = indexed_batch(store, "batch_d", [b'{"custom_id":"a"}'])
    assert store.read_line("batch_d", file_id, store.line_number("batch_d", 0, 0))
    store.drop_batch_work("batch_d")
    with pytest.raises(FileNotFoundError):
        store.line_number("batch_d", 0, 0)
    with pytest.raises(FileNotFoundError):
        store.read_line("batch_d", file_id, 0)
    with pytest.raises(FileNotFoundError):
        store.index_total("batch_d")


def test_a_line_committed_after_its_batch_was_finalized_is_not_kept(store: Store) -> None:
    """A zombie line: its worker lost its heartbeat, the line ran again elsewhere, the batch was
    finalized and its work dropped, then the zombie commits. A store refuses it (local) or the
    retention pass drops it (S3); either way the batch keeps only its finalized record. Batches
    still running keep their work, whatever sorts next to them."""
    lines = [b'{"custom_id":"a"}', b'{"custom_id":"b"}']
    indexed_batch(store, "batch_zz", lines)
    store.commit_result("batch_zz", 0, b"ran")
    store.write_finalized("batch_zz", b'{"total": 2}')
    store.drop_batch_work("batch_zz")
    try:
        store.commit_result("batch_zz", 1, b"zombie")
    except BatchFinalized:
        pass
    # Finalized, but its work never dropped (the drop cut short by a crash).
    indexed_batch(store, "batch_r0", lines)
    store.commit_result("batch_r0", 0, b"ran")
    store.write_finalized("batch_r0", b'{"total": 2}')
    # Running: one's id a prefix of the other's, and of the finalized one's.
    running = {}
    for batch_id in ("batch_r", "batch_r00"):
        indexed_batch(store, batch_id, lines)
        store.commit_result(batch_id, 1, b"ran")
        running[batch_id] = store.keys(f"batches/{batch_id}/")
    out = RetentionActivities(store)._delete_expired(int(time.time()))
    for batch_id in ("batch_zz", "batch_r0"):
        assert store.keys(f"batches/{batch_id}/") == [f"batches/{batch_id}/finalized.json"]
    assert store.read_finalized("batch_r0") == b'{"total": 2}'
    assert out.finalized_leftovers in (1, 2)  # batch_r0, and batch_zz where kept (S3)
    for batch_id, keys in running.items():
        assert store.keys(f"batches/{batch_id}/") == keys
        assert store.get_result(batch_id, 1) == b"ran"
    assert store.drop_finalized_leftovers() == 0


def test_the_work_of_a_batch_that_ended_without_finalizing_is_dropped(store: Store) -> None:
    """A batch that never finalized (its store was unavailable until its deadline, its input was
    rejected, it was terminated) leaves its pinned input, index, results and partial answers:
    the retention pass drops them once Temporal says its workflow is closed, and only then."""
    lines = [b'{"n": 0}', b'{"n": 1}']
    long_ago, running, finalized = (new_batch_id(1_000_000) for _ in range(3))  # in 1970
    young = new_batch_id()
    for batch_id in (long_ago, running, young, finalized):
        indexed_batch(store, batch_id, lines)
        store.commit_result(batch_id, 0, b"ran")
        store.put_partial(batch_id, 1, b"half")
    store.write_finalized(finalized, b"{}")
    store.drop_batch_work(finalized)
    assert sorted(store.unfinalized_batches()) == sorted([long_ago, running, young])

    asked: list[str] = []

    async def closed(batch_id: str) -> bool:
        asked.append(batch_id)
        return batch_id != running

    now = int(time.time())
    assert asyncio.run(drop_ended_work(store, closed, now)) == 1
    assert sorted(asked) == sorted([long_ago, running])  # the young one is not asked about
    assert store.keys(f"batches/{long_ago}/") == []
    assert store.get_partial(long_ago, 1) is None
    for batch_id in (running, young):
        assert store.get_result(batch_id, 0) == b"ran"
        assert store.get_partial(batch_id, 1) == b"half"
    assert sorted(store.unfinalized_batches()) == sorted([running, young])
    assert store.keys(f"batches/{finalized}/") == [f"batches/{finalized}/finalized.json"]
