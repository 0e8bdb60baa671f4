"""The OpenAI Batches API over real HTTP: create checks, retrieve/cancel of unknown or foreign
batches, newest-first listing past 100 batches, and input validation failing a batch before any
line is sent. Every error is checked in OpenAI's envelope."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
import pytest_asyncio
from openai.types import Batch as SDKBatch

from tests.e2e.stack import SharedStacks, Stack, assert_error, jsonl, wait_terminal
from tests.polling import poll_until

ALPHA, BETA, GAMMA = "sk-test-alpha", "sk-test-beta", "sk-test-gamma"
ENDPOINT = "/v1/chat/completions"
TINY_LINE = (
    '{{"custom_id":"a{i}","method":"POST","url":"/v1/chat/completions",'
    '"body":{{"model":"demo","messages":[{{"role":"user","content":"x"}}]}}}}'
)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def stack(shared_stacks: SharedStacks) -> AsyncIterator[Stack]:
    """One lease of the session's default stack for the module (its tests keep to their own
    workspaces: alpha and beta for the checks, gamma for the listing)."""
    async with shared_stacks.lease() as s:
        yield s


@pytest_asyncio.fixture(loop_scope="session")
async def http(stack: Stack) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=60, trust_env=False) as c:
        yield c


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def alpha_file(stack: Stack) -> str:
    """A valid 2-line input file of workspace alpha."""
    f = await stack.client(ALPHA).files.create(file=("two.jsonl", jsonl(2)), purpose="batch")
    return f.id


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def finished(stack: Stack, alpha_file: str) -> SDKBatch:
    """A completed batch of workspace alpha."""
    client = stack.client(ALPHA)
    b = await client.batches.create(
        input_file_id=alpha_file, endpoint=ENDPOINT, completion_window="24h"
    )
    done = await wait_terminal(client, b.id, within=60)
    assert done.status == "completed", done
    return done


async def sim_batch_requests(stack: Stack) -> dict[str, int]:
    async with httpx.AsyncClient(trust_env=False) as c:
        stats = (await c.get(stack.sim.url + "/sim/stats")).json()
    return dict(stats["batch"]["by_batch"])


def assert_not_stubs(rows: list[dict[str, Any]]) -> None:
    """Listed rows are the batches as their workflows describe them. A row the api could not
    read (api/batches/batches_api.py `_load_or_stub`) is made from search attributes and has an
    empty input_file_id and completion_window: a listing of such stubs would hide a broken read."""
    stubs = [r["id"] for r in rows if not r["input_file_id"] or not r["completion_window"]]
    assert not stubs, f"stub rows: {stubs}"


def create_body(file_id: str, **over: Any) -> dict[str, Any]:
    return {"input_file_id": file_id, "endpoint": ENDPOINT, "completion_window": "24h", **over}


# ---- create ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("over", "param"),
    [
        ({"endpoint": "/v1/moderations"}, "endpoint"),
        ({"endpoint": "/v1/chat/completions/"}, "endpoint"),
        ({"endpoint": None}, "endpoint"),
        ({"completion_window": "12h"}, "completion_window"),
        ({"completion_window": "24"}, "completion_window"),
        ({"completion_window": 24}, "completion_window"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
        ({"metadata": {"k": 1}}, "metadata"),
        ({"metadata": {"k" * 65: "v"}}, "metadata"),
        ({"metadata": {"k": "v" * 513}}, "metadata"),
        ({"metadata": ["k", "v"]}, "metadata"),
        ({"input_file_id": None}, "input_file_id"),
        ({"input_file_id": ""}, "input_file_id"),
        # Wrong JSON types: lists and objects where a string or an object belongs.
        ({"completion_window": ["24h"]}, "completion_window"),
        ({"completion_window": {"hours": 24}}, "completion_window"),
        ({"endpoint": [ENDPOINT]}, "endpoint"),
        ({"endpoint": {"path": ENDPOINT}}, "endpoint"),
        ({"input_file_id": ["file-abc"]}, "input_file_id"),
        ({"input_file_id": {"id": "file-abc"}}, "input_file_id"),
        ({"metadata": {"k": {"nested": "v"}}}, "metadata"),
        ({"metadata": {"k": ["v"]}}, "metadata"),
        ({"metadata": "k=v"}, "metadata"),
    ],
)
async def test_create_rejects_bad_parameters(
    stack: Stack, http: httpx.AsyncClient, alpha_file: str, over: dict[str, Any], param: str
) -> None:
    resp = await http.post(
        "/v1/batches", headers=stack.auth(), json=create_body(alpha_file, **over)
    )
    assert_error(resp, 400, param=param)


@pytest.mark.parametrize(
    "content",
    [b"not json", b'{"input_file_id": ', b"[1, 2]", b'["input_file_id"]', b'"24h"', b"3", b""],
)
async def test_create_rejects_non_object_body(
    stack: Stack, http: httpx.AsyncClient, content: bytes
) -> None:
    resp = await http.post(
        "/v1/batches",
        headers={**stack.auth(), "Content-Type": "application/json"},
        content=content,
    )
    assert_error(resp, 400, param=None)


@pytest.mark.parametrize(
    ("params", "param"),
    [({"limit": "abc"}, "limit"), ({"limit": "1.5"}, "limit"), ({"limit": ""}, "limit")],
)
async def test_list_rejects_query_of_the_wrong_type(
    stack: Stack, http: httpx.AsyncClient, params: dict[str, str], param: str
) -> None:
    assert_error(
        await http.get("/v1/batches", headers=stack.auth(), params=params), 400, param=param
    )


async def test_create_with_sdk_bad_window_raises_bad_request(stack: Stack, alpha_file: str) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        await stack.client(ALPHA).batches.create(
            input_file_id=alpha_file,
            endpoint=ENDPOINT,
            completion_window="12h",  # type: ignore[arg-type]
        )
    assert exc.value.status_code == 400 and exc.value.param == "completion_window"


async def test_create_with_sixteen_metadata_pairs_is_accepted(
    stack: Stack, http: httpx.AsyncClient, alpha_file: str
) -> None:
    meta = {f"k{i:02d}": "v" * 512 for i in range(16)}
    meta["k" * 64] = meta.pop("k00")
    resp = await http.post(
        "/v1/batches", headers=stack.auth(), json=create_body(alpha_file, metadata=meta)
    )
    assert resp.status_code == 200, resp.text
    b = SDKBatch.model_validate(resp.json())
    assert b.metadata == meta and b.status == "validating"
    assert b.input_file_id == alpha_file and b.endpoint == ENDPOINT
    assert b.completion_window == "24h" and b.expires_at == b.created_at + 24 * 3600
    assert (await stack.client(ALPHA).batches.retrieve(b.id)).metadata == meta


async def test_create_with_unknown_or_foreign_file_is_404(
    stack: Stack, http: httpx.AsyncClient, alpha_file: str
) -> None:
    for file_id in ("file-doesnotexist", "nonsense", "file-../../etc"):
        resp = await http.post("/v1/batches", headers=stack.auth(), json=create_body(file_id))
        assert_error(resp, 404, param="input_file_id", code="invalid_file")
    # alpha's file, used by beta
    resp = await http.post("/v1/batches", headers=stack.auth(BETA), json=create_body(alpha_file))
    assert_error(resp, 404, param="input_file_id", code="invalid_file")
    with pytest.raises(openai.NotFoundError):
        await stack.client(BETA).batches.create(
            input_file_id=alpha_file, endpoint=ENDPOINT, completion_window="24h"
        )
    # beta made no batch out of it
    assert (await stack.client(BETA).batches.list()).data == []


@pytest.mark.store  # also run on the S3 store by `make test` (tests/e2e/stack.py)
async def test_create_from_batch_output_file_is_400(
    stack: Stack, http: httpx.AsyncClient, finished: SDKBatch
) -> None:
    client = stack.client(ALPHA)
    assert finished.output_file_id
    out = await client.files.retrieve(finished.output_file_id)
    assert out.purpose == "batch_output"
    # listed under its purpose
    outputs = await client.files.list(purpose="batch_output")
    assert finished.output_file_id in {f.id for f in outputs.data}
    assert all(f.purpose == "batch_output" for f in outputs.data)
    resp = await http.post("/v1/batches", headers=stack.auth(), json=create_body(out.id))
    assert_error(resp, 400, param="input_file_id")
    # The simulator counts requests per batch: this one sent its 2 lines (which makes the
    # "no line was sent" checks below meaningful).
    assert (await sim_batch_requests(stack)).get(finished.id) == 2


# ---- retrieve / cancel -------------------------------------------------------------------------


async def test_unknown_batch_is_404_never_500(stack: Stack, http: httpx.AsyncClient) -> None:
    unknown = (
        "batch_doesnotexist",
        "nonsense",
        "batch_",
        "batch_0123456789abcdef0123456789abcdef",
        "file-abc",
        "route-scheduler:x",
        "batch_%27%20OR%201%3D1",
        "x" * 300,
    )
    for batch_id in unknown:
        assert_error(
            await http.get(f"/v1/batches/{batch_id}", headers=stack.auth()),
            404,
            param="batch_id",
        )
        assert_error(
            await http.post(f"/v1/batches/{batch_id}/cancel", headers=stack.auth()),
            404,
            param="batch_id",
        )


async def test_other_workspaces_batch_is_404_on_retrieve_and_cancel(
    stack: Stack, http: httpx.AsyncClient, alpha_file: str, finished: SDKBatch
) -> None:
    alpha = stack.client(ALPHA)
    # A batch that is not finished: alpha pauses it at once so it cannot finish meanwhile.
    live = await alpha.batches.create(
        input_file_id=alpha_file, endpoint=ENDPOINT, completion_window="24h"
    )
    paused = await http.post(f"/v1/batches/{live.id}/pause", headers=stack.auth())
    assert paused.status_code == 200, paused.text
    assert paused.json()["backfill"]["paused"] is True
    for batch_id in (live.id, finished.id):
        for method, path in (("GET", ""), ("POST", "/cancel")):
            resp = await http.request(
                method, f"/v1/batches/{batch_id}{path}", headers=stack.auth(BETA)
            )
            assert_error(resp, 404, param="batch_id")
        with pytest.raises(openai.NotFoundError):
            await stack.client(BETA).batches.retrieve(batch_id)
        assert batch_id not in {b.id async for b in stack.client(BETA).batches.list()}
    # beta's cancel touched nothing: the live batch is still going, and completes once resumed
    still = await alpha.batches.retrieve(live.id)
    assert still.status in ("validating", "in_progress") and still.cancelling_at is None, still
    resumed = await http.post(f"/v1/batches/{live.id}/resume", headers=stack.auth())
    assert resumed.status_code == 200, resumed.text
    done = await wait_terminal(alpha, live.id, within=60)
    assert done.status == "completed" and done.cancelling_at is None
    # The owner cancelling a finished batch is a conflict, not a 404.
    resp = await http.post(f"/v1/batches/{finished.id}/cancel", headers=stack.auth())
    assert_error(resp, 409, param=None, code="invalid_batch_status")


# ---- list --------------------------------------------------------------------------------------


async def test_list_newest_first_pages_past_100(stack: Stack, http: httpx.AsyncClient) -> None:
    """105 batches in workspace gamma (used by no other test). Most fail validation at once
    (empty input, cheap); every tenth runs one line, so running and closed executions (which
    SQL visibility returns running-first) are mixed while listing."""
    client = stack.client(GAMMA)
    good = (await client.files.create(file=("one.jsonl", jsonl(1)), purpose="batch")).id
    empty = (await client.files.create(file=("empty.jsonl", b""), purpose="batch")).id
    # Created in waves of 8 concurrent requests (sequential creates are ~5x slower here): the
    # order inside a wave is the server's (created_at, id); every wave is newer than the last.
    batches: list[SDKBatch] = []
    for wave in range(0, 105, 8):
        batches += await asyncio.gather(
            *(
                client.batches.create(
                    input_file_id=good if i % 10 == 0 else empty,
                    endpoint=ENDPOINT,
                    completion_window="24h",
                    metadata={"n": str(i)},
                )
                for i in range(wave, min(wave + 8, 105))
            )
        )
    created = [b.id for b in batches]
    assert len(set(created)) == 105
    newest_first = [b.id for b in sorted(batches, key=lambda b: (b.created_at, b.id), reverse=True)]
    wave_of = {b.id: int(b.metadata["n"]) // 8 for b in batches if b.metadata}
    waves = [wave_of[i] for i in newest_first]
    assert waves == sorted(waves, reverse=True)

    # Temporal visibility is eventually consistent: the newest row can lag its creation by a
    # few hundred ms (more on a loaded machine). Wait, bounded, until the newest is listed.
    await poll_until(
        lambda: client.batches.list(limit=1),
        lambda page: bool(page.data) and page.data[0].id == newest_first[0],
        timeout=30,
        what="the newest batch to be listed first",
        interval=0.05,
    )

    # The SDK's auto-pagination yields every id exactly once, newest first, each row read from
    # its workflow (not a stub made from search attributes, which has no input file).
    listed = [b async for b in client.batches.list(limit=100)]
    assert [b.id for b in listed] == newest_first
    assert_not_stubs([b.model_dump() for b in listed])

    # pages of 10 with after=last_id
    seen: list[str] = []
    after: str | None = None
    pages = 0
    while True:
        assert pages < 11, "paging never ended"
        params: dict[str, Any] = {"limit": 10}
        if after is not None:
            params["after"] = after
        resp = await http.get("/v1/batches", headers=stack.auth(GAMMA), params=params)
        assert resp.status_code == 200, resp.text
        page = resp.json()
        pages += 1
        ids = [b["id"] for b in page["data"]]
        assert_not_stubs(page["data"])
        assert page["object"] == "list"
        assert page["first_id"] == ids[0] and page["last_id"] == ids[-1]
        assert page["has_more"] is (pages < 11), (pages, page["has_more"])
        seen += ids
        if not page["has_more"]:
            break
        after = page["last_id"]
    assert pages == 11
    assert seen == newest_first

    # limit=100: one page of 100 with more, then the last 5
    first = await client.batches.list(limit=100)
    assert [b.id for b in first.data] == newest_first[:100] and first.has_more is True
    rest = await client.batches.list(limit=100, after=first.data[-1].id)
    assert [b.id for b in rest.data] == newest_first[100:] and rest.has_more is False
    # a page ending exactly at the oldest batch has no more
    exact = await client.batches.list(limit=5, after=newest_first[99])
    assert [b.id for b in exact.data] == newest_first[100:] and exact.has_more is False

    # default limit is 20
    default = (await http.get("/v1/batches", headers=stack.auth(GAMMA))).json()
    assert [b["id"] for b in default["data"]] == newest_first[:20] and default["has_more"]

    # the SDK's auto-pagination with a smaller page
    assert [b.id async for b in client.batches.list(limit=30)] == newest_first

    # other workspaces see none of them
    assert not set(created) & {b.id async for b in stack.client(BETA).batches.list(limit=100)}

    # bad paging parameters
    for params, param in (
        ({"limit": 0}, "limit"),
        ({"limit": 101}, "limit"),
        ({"after": "batch_doesnotexist"}, "after"),
    ):
        resp = await http.get("/v1/batches", headers=stack.auth(GAMMA), params=params)
        assert_error(resp, 400, param=param)
    # paging after another workspace's batch is refused like an unknown id
    resp = await http.get("/v1/batches", headers=stack.auth(BETA), params={"after": created[0]})
    assert_error(resp, 400, param="after")


# ---- validation failures, end to end -----------------------------------------------------------


@pytest.mark.store  # also run on the S3 store by `make test` (tests/e2e/stack.py)
async def test_invalid_inputs_fail_the_batch_and_send_nothing(stack: Stack) -> None:
    client = stack.client(ALPHA)
    many = ("\n".join(TINY_LINE.format(i=i) for i in range(50_001)) + "\n").encode()
    assert many.count(b"\n") == 50_001
    latin1 = "\n".join(
        json.dumps(
            {
                "custom_id": f"caf\u00e9-{i}",
                "method": "POST",
                "url": ENDPOINT,
                "body": {
                    "model": "demo",
                    "messages": [{"role": "user", "content": "d\u00e9j\u00e0"}],
                },
            },
            ensure_ascii=False,
        )
        for i in range(3)
    ).encode("latin-1")
    lines = [
        TINY_LINE.format(i=1),
        TINY_LINE.format(i=2),
        TINY_LINE.format(i=1),  # duplicate custom_id, line 3
        TINY_LINE.format(i=4).replace('"/v1/chat/completions"', '"/v1/embeddings"'),  # line 4
        TINY_LINE.format(i=5),
    ]
    mixed = ("\n".join(lines) + "\n").encode()
    inputs = {"empty": b"", "latin1": latin1, "many": many, "mixed": mixed}

    batches: dict[str, str] = {}
    for name, data in inputs.items():
        f = await client.files.create(file=(f"{name}.jsonl", data), purpose="batch")
        assert f.bytes == len(data)
        b = await client.batches.create(
            input_file_id=f.id, endpoint=ENDPOINT, completion_window="24h"
        )
        batches[name] = b.id
    done = dict(
        zip(
            batches,
            await asyncio.gather(*(wait_terminal(client, i, within=60) for i in batches.values())),
            strict=True,
        )
    )

    for name, b in done.items():
        assert b.status == "failed", (name, b)
        assert b.failed_at and b.in_progress_at is None and b.completed_at is None, b
        assert b.output_file_id is None and b.error_file_id is None, b
        assert b.request_counts is None or b.request_counts.completed == 0, b
        assert b.errors and b.errors.object == "list", b

    def codes(b: SDKBatch) -> list[tuple[str | None, int | None, str | None]]:
        assert b.errors and b.errors.data
        return [(e.code, e.line, e.param) for e in b.errors.data]

    assert codes(done["empty"]) == [("empty_file", None, None)]
    assert codes(done["latin1"])[0] == ("invalid_json_line", 1, None)
    assert codes(done["many"]) == [("too_many_requests", 50_001, None)]
    assert codes(done["mixed"]) == [
        ("duplicate_custom_id", 3, "custom_id"),
        ("url_mismatch", 4, "url"),
    ]
    for b in done.values():
        assert b.errors and all(e.message for e in b.errors.data)

    # Not one line of any of them reached the model server.
    sent = await sim_batch_requests(stack)
    assert {name: sent.get(i, 0) for name, i in batches.items()} == dict.fromkeys(batches, 0)

    # The failed batch reads the same over raw HTTP, errors in OpenAI's shape.
    async with httpx.AsyncClient(base_url=stack.api_url, trust_env=False) as http:
        raw = (await http.get(f"/v1/batches/{batches['mixed']}", headers=stack.auth())).json()
    assert raw["status"] == "failed"
    assert raw["errors"]["object"] == "list"
    assert [(e["code"], e["line"]) for e in raw["errors"]["data"]] == [
        ("duplicate_custom_id", 3),
        ("url_mismatch", 4),
    ]
    assert time.time() - raw["failed_at"] < 120
