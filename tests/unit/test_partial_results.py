"""Partial results (api/batches/results.py) on a real store: pages follow the committed prefix in
input order, the cursor never serves a record twice, and across finalizing (the per-line results
dropped, the files assembled) the union of all pages is exactly the output and error files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from activities.finalizing import FinalizeActivities
from api.batches.results import Cursor, read_page
from api.errors import InvalidRequest
from backfill.batches.input_rules import validate_input
from backfill.files import FileStore, Store
from backfill.platform.config import Settings
from backfill.platform.messages import FinalizeInput

BATCH = "batch_partial"
SETTINGS = Settings(
    models=[{"id": "demo", "routes": [{"id": "r1", "base_url": "http://upstream/v1"}]}]
)


def prepared(root: Path, n: int) -> tuple[Store, str]:
    """A store holding an n-line batch's pinned input and index (as validation leaves it)."""
    store = FileStore(root)
    up = store.begin_upload(1 << 30)
    for i in range(n):
        req = {"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions"}
        req["body"] = {"model": "demo", "messages": [{"role": "user", "content": "hi"}]}
        up.write(json.dumps(req).encode() + b"\n")
    file_id = up.finish(workspace="w", filename="in.jsonl", purpose="batch").id
    store.snapshot_input(BATCH, file_id)
    with store.open_input(BATCH, file_id) as f:
        index = validate_input(
            f, batch_id=BATCH, endpoint="/v1/chat/completions", settings=SETTINGS
        )
    store.write_index(BATCH, index.offsets, index.lengths, index.routes, index.route_line_numbers)
    return store, file_id


def commit(store: Store, i: int, status: int) -> None:
    record = {
        "id": f"batch_req_{i}",
        "custom_id": f"c{i}",
        "response": {"status_code": status, "request_id": "r", "body": {"n": i}},
        "error": None,
    }
    store.commit_result(BATCH, i, json.dumps(record).encode())


def fetch(store: Store, cursor: Cursor, limit: int) -> tuple[list[dict], Cursor, bool]:
    page, has_more = read_page(store, BATCH, cursor, limit)
    body = json.loads(page.body(has_more))
    assert body["next_after"] == str(page.cursor)
    return body["data"], Cursor.parse(body["next_after"]), body["has_more"]


def file_records(store: Store, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(line) for line in store.read_file(file_id).splitlines()]


@pytest.fixture(autouse=True)
def _no_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "fsync", lambda fd: None)


def test_a_page_stops_at_the_first_line_without_a_record(tmp_path: Path) -> None:
    store, _ = prepared(tmp_path, 6)
    for i in (0, 1, 3, 4):  # line 2 still running
        commit(store, i, 200 if i != 1 else 400)
    data, cursor, _ = fetch(store, Cursor(), 100)
    assert [(d["line"], d["file"]) for d in data] == [(0, "output"), (1, "error")]
    assert cursor == Cursor(1, 1)
    assert fetch(store, cursor, 100)[0] == []  # nothing new: nothing again
    commit(store, 2, 200)
    data, cursor, _ = fetch(store, cursor, 2)  # the limit holds
    assert [d["line"] for d in data] == [2, 3] and cursor == Cursor(3, 1)
    assert [d["record"]["custom_id"] for d in data] == ["c2", "c3"]


def test_before_the_index_exists_a_page_is_empty(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    page, has_more = read_page(store, BATCH, Cursor(), 10)
    assert page.items == [] and not has_more


@pytest.mark.parametrize("text", ["x", "1", "1.", ".2", "-1.0", "1.2.3", "1e3.0"])
def test_a_cursor_not_given_by_a_page_is_refused(text: str) -> None:
    with pytest.raises(InvalidRequest):
        Cursor.parse(text)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    n=st.integers(min_value=1, max_value=40),
    data=st.data(),
)
def test_the_union_of_pages_fetched_at_any_time_is_the_final_files(
    tmp_path_factory: pytest.TempPathFactory, n: int, data: st.DataObject
) -> None:
    """Lines finish in a random order, some fail; a client fetches at random moments with
    random page sizes, also after finalizing (the per-line results are then gone)."""
    store, file_id = prepared(tmp_path_factory.mktemp("store"), n)
    order = data.draw(st.permutations(range(n)), label="finish order")
    statuses = data.draw(
        st.lists(st.sampled_from([200, 200, 200, 400, 500]), min_size=n, max_size=n),
        label="statuses",
    )
    finished = data.draw(st.integers(0, n), label="lines finished before the batch ends")
    got: list[dict] = []
    cursor = Cursor()
    for i in order[:finished]:
        commit(store, i, statuses[i])
        if data.draw(st.booleans(), label="fetch now"):
            page, cursor, _ = fetch(store, cursor, data.draw(st.integers(1, 7), label="limit"))
            got += page
    out = FinalizeActivities(store)._finalize(
        FinalizeInput(batch_id=BATCH, workspace="w", input_file_id=file_id, reason="expired")
    )
    has_more = True
    while has_more:
        page, cursor, has_more = fetch(store, cursor, data.draw(st.integers(1, 7), label="limit"))
        got += page
    output = file_records(store, out.output_file_id)
    errors = file_records(store, out.error_file_id)
    assert [d["record"] for d in got if d["file"] == "output"] == output
    assert [d["record"] for d in got if d["file"] == "error"] == errors
    assert sorted(r["custom_id"] for r in output + errors) == sorted(f"c{i}" for i in range(n))
