"""`backfill batch download --partial` (tools/client/results.py) writes the records byte for byte
as the final output and error files hold them: the page the api serves (api/batches/results.py, on a
real store) is read without decoding a record, so non-ASCII text, `1.10` and `1e999` in a model's
answer come out as they went in."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from activities.finalizing import FinalizeActivities
from api.batches.results import Cursor, read_page
from backfill.batches.records import error_record_bytes, response_record_bytes
from backfill.files import Store
from backfill.platform.messages import FinalizeInput
from tests.unit.test_partial_results import BATCH, prepared
from tools.client.connection import Connection
from tools.client.raw_page import read_page as read_raw_page
from tools.client.results import _download_partial

ANSWER = '{"choices":[{"message":{"content":"héllo — 日本 \\u00e9"}}],"x":1.10,"y":1e999}'
"""A model's answer as it came off the wire: raw and escaped non-ASCII, a trailing zero, and a
number too large for a float (all valid JSON)."""


@pytest.fixture(autouse=True)
def _no_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "fsync", lambda fd: None)


def serving(store: Store) -> Connection:
    """A CLI connection whose results endpoint is the api's page reader on `store`."""

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == f"/v1/batches/{BATCH}/results"
        cursor = Cursor.parse(request.url.params.get("after"))
        limit = int(request.url.params["limit"])
        page, has_more = read_page(store, BATCH, cursor, limit)
        return httpx.Response(200, content=page.body(has_more))

    conn = Connection(base_url="http://api/v1", api_key="sk-test")
    conn._http = httpx.Client(base_url="http://api/v1", transport=httpx.MockTransport(handler))
    return conn


def test_partial_files_are_the_final_files_byte_for_byte(tmp_path: Path) -> None:
    store, file_id = prepared(tmp_path / "store", 4)
    for i in (0, 1):
        store.commit_result(BATCH, i, response_record_bytes(f"c{i}", 200, f"r{i}", ANSWER))
    store.commit_result(BATCH, 2, error_record_bytes("c2", "upstream_error", "naïve — 1.10"))
    out = tmp_path / "out"
    out.mkdir()
    conn = serving(store)
    assert _download_partial(conn, BATCH, out) == 0  # while it runs: lines 0-2
    store.commit_result(BATCH, 3, response_record_bytes("c3", 200, "r3", ANSWER))
    done = FinalizeActivities(store)._finalize(
        FinalizeInput(batch_id=BATCH, workspace="w", input_file_id=file_id, reason="completed")
    )
    assert _download_partial(conn, BATCH, out) == 0  # the rest, from the assembled files
    assert done.output_file_id is not None and done.error_file_id is not None
    final_output = store.read_file(done.output_file_id)
    assert b"1.10" in final_output and b"1e999" in final_output and "日本".encode() in final_output
    assert (out / f"{BATCH}.output.partial.jsonl").read_bytes() == final_output
    assert (out / f"{BATCH}.errors.partial.jsonl").read_bytes() == store.read_file(
        done.error_file_id
    )


def test_a_page_s_records_are_read_as_the_server_wrote_them() -> None:
    record = b'{"a": "\\u00e9\xc3\xa9", "n": [1.10, 1e999, -0.0, {"k": {}}], "s": "]},\\""}'
    body = (
        b'{ "object": "list", "data": [ {"line": 0, "file": "output", "record": %s},'
        b'{"record":{},"line":null,"file":"error"} ], "next_after": "1.1", "has_more": true }'
        % record
    )
    page = read_raw_page(body)
    assert page.records == [("output", record), ("error", b"{}")]
    assert (page.next_after, page.has_more) == ("1.1", True)


@pytest.mark.parametrize(
    "body",
    [b"", b"[]", b'{"data": [{"file": "output"}]}', b'{"data": [{"record": 1}]}', b"{} x"],
)
def test_what_is_not_a_results_page_is_refused(body: bytes) -> None:
    with pytest.raises(ValueError):
        read_raw_page(body)
