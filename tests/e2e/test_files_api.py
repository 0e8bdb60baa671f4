"""The OpenAI Files API over real HTTP: upload (streamed, capped), list, retrieve, content,
delete, auth and workspace isolation, each error in OpenAI's envelope.

Files need no worker, so the stacks here run the api alone (one per module, plus a second one
with a 1 MB cap for the exact size boundary)."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import pytest_asyncio
from openai.types import FileDeleted, FileObject

from tests.e2e.stack import Stack, assert_error, auth, jsonl
from tests.polling import poll_until

ALPHA, BETA, GAMMA, ADMIN = "sk-test-alpha", "sk-test-beta", "sk-test-gamma", "sk-test-admin"
MiB = 1024 * 1024
DEFAULT_CAP = 200 * MiB


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def stack(tmp_path_factory: pytest.TempPathFactory, dev_server: Any) -> AsyncIterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("files-api"), dev_server.address)
    async with s.running(workers=0):
        yield s


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def small_stack(
    tmp_path_factory: pytest.TempPathFactory, dev_server: Any
) -> AsyncIterator[Stack]:
    s = Stack(
        tmp_path_factory.mktemp("files-api-1mb"),
        dev_server.address,
        limits={"max_file_bytes": 1_000_000},
    )
    async with s.running(workers=0):
        yield s


@pytest_asyncio.fixture(loop_scope="session")
async def http(stack: Stack) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=120, trust_env=False) as c:
        yield c


def stored_names(stack: Stack) -> set[str]:
    """Everything under the store's `files/`, unfinished uploads included."""
    return {name.removeprefix("files/") for name in stack.store().keys("files/")}


async def upload(client: openai.AsyncOpenAI, data: bytes, name: str = "in.jsonl") -> FileObject:
    return await client.files.create(file=(name, data), purpose="batch")


# ---- upload, retrieve, content ------------------------------------------------------------------


@pytest.mark.store  # also run on the S3 store by `make test` (tests/e2e/stack.py)
async def test_upload_with_sdk_returns_file_object_and_content_is_byte_identical(
    stack: Stack,
) -> None:
    client = stack.client(ALPHA)
    # Not just ASCII JSONL: CRLF, UTF-8, a NUL, a lone \xff and no final newline survive as is.
    data = jsonl(3) + "é ✓\r\n".encode() + b"\x00\xff tail without newline"
    before = int(time.time())
    f = await upload(client, data, "my input.jsonl")
    assert isinstance(f, FileObject)
    assert f.id.startswith("file-")
    assert f.object == "file"
    assert f.bytes == len(data)
    assert f.filename == "my input.jsonl"
    assert f.purpose == "batch"
    assert f.status == "processed"
    assert before - 1 <= f.created_at <= int(time.time()) + 1

    got = await client.files.retrieve(f.id)
    assert got.model_dump() == f.model_dump()

    content = await client.files.content(f.id)
    assert content.content == data
    # Stored once, in the store, with the same bytes.
    assert stack.store().read_file(f.id) == data
    assert {n for n in stored_names(stack) if n.startswith(f.id)} == {
        f"{f.id}.data",
        f"{f.id}.json",
    }


async def test_upload_response_shape_over_raw_http(stack: Stack, http: httpx.AsyncClient) -> None:
    resp = await http.post(
        "/v1/files",
        headers=auth(),
        data={"purpose": "batch"},
        files={"file": ("raw.jsonl", b'{"a": 1}\n', "application/jsonl")},
    )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert "workspace" not in body  # the owner is internal
    assert body["object"] == "file" and body["bytes"] == 9 and body["filename"] == "raw.jsonl"
    content = await http.get(f"/v1/files/{body['id']}/content", headers=auth())
    assert content.status_code == 200
    assert content.content == b'{"a": 1}\n'


async def test_retrieve_unknown_file_is_404(http: httpx.AsyncClient) -> None:
    for file_id in ("file-doesnotexist", "nonsense", "file-..", "batch_abc"):
        for path in (f"/v1/files/{file_id}", f"/v1/files/{file_id}/content"):
            assert_error(
                await http.get(path, headers=auth()), 404, param="id", code="file_not_found"
            )
        assert_error(
            await http.delete(f"/v1/files/{file_id}", headers=auth()),
            404,
            param="id",
            code="file_not_found",
        )


# ---- list --------------------------------------------------------------------------------------


@pytest.mark.store  # also run on the S3 store by `make test` (tests/e2e/stack.py)
async def test_list_paging_order_and_purpose_filter(stack: Stack, http: httpx.AsyncClient) -> None:
    # Workspace gamma is used only by this test, so its listing is exactly these files.
    client = stack.client(GAMMA)
    ids = {(await upload(client, jsonl(1, prefix=f"f{i}"), f"f{i}.jsonl")).id for i in range(5)}

    full = await client.files.list(limit=100)
    assert {f.id for f in full.data} == ids and len(full.data) == 5
    assert full.has_more is False
    newest_first = [f.id for f in full.data]
    keys = [(f.created_at, f.id) for f in full.data]
    assert keys == sorted(keys, reverse=True)

    # Default order is desc; asc is its exact reverse.
    resp = await http.get("/v1/files", headers=auth(GAMMA))
    assert resp.status_code == 200
    body = resp.json()
    assert body["object"] == "list" and [f["id"] for f in body["data"]] == newest_first
    assert body["first_id"] == newest_first[0] and body["last_id"] == newest_first[-1]
    assert body["has_more"] is False
    asc = await client.files.list(order="asc", limit=100)
    assert [f.id for f in asc.data] == newest_first[::-1]

    # Paging with limit/after: every id once, in order, has_more/first_id/last_id right.
    seen: list[str] = []
    after: str | None = None
    pages: list[dict[str, Any]] = []
    while True:
        assert len(pages) < 3, "paging never ended"
        params: dict[str, Any] = {"limit": 2}
        if after is not None:
            params["after"] = after
        page = (await http.get("/v1/files", headers=auth(GAMMA), params=params)).json()
        pages.append(page)
        data_ids = [f["id"] for f in page["data"]]
        assert page["first_id"] == data_ids[0] and page["last_id"] == data_ids[-1]
        seen += data_ids
        if not page["has_more"]:
            break
        after = page["last_id"]
    assert [len(p["data"]) for p in pages] == [2, 2, 1]
    assert [p["has_more"] for p in pages] == [True, True, False]
    assert seen == newest_first

    # A page that ends exactly at the last file says there is no more.
    last_two = (
        await http.get(
            "/v1/files", headers=auth(GAMMA), params={"limit": 2, "after": newest_first[2]}
        )
    ).json()
    assert [f["id"] for f in last_two["data"]] == newest_first[3:]
    assert last_two["has_more"] is False

    # asc paging with after
    asc_page = await client.files.list(order="asc", limit=2, after=newest_first[-1])
    assert [f.id for f in asc_page.data] == newest_first[::-1][1:3]
    assert asc_page.has_more is True

    # The SDK's auto-pagination walks the same list.
    assert [f.id async for f in client.files.list(limit=2)] == newest_first

    # purpose filter
    assert {f.id for f in (await client.files.list(purpose="batch")).data} == ids
    none = await client.files.list(purpose="batch_output")
    assert none.data == [] and none.has_more is False
    empty = (
        await http.get("/v1/files", headers=auth(GAMMA), params={"purpose": "batch_output"})
    ).json()
    assert empty == {
        "object": "list",
        "data": [],
        "first_id": None,
        "last_id": None,
        "has_more": False,
    }


async def test_list_bad_parameters_are_400(http: httpx.AsyncClient) -> None:
    for params, param in (
        ({"limit": 0}, "limit"),
        ({"limit": 10_001}, "limit"),
        ({"limit": "many"}, "limit"),
        ({"order": "sideways"}, "order"),
        ({"after": "file-doesnotexist"}, "after"),
    ):
        assert_error(await http.get("/v1/files", headers=auth(), params=params), 400, param=param)


# ---- delete ------------------------------------------------------------------------------------


@pytest.mark.store  # also run on the S3 store by `make test` (tests/e2e/stack.py)
async def test_delete_then_404(stack: Stack, http: httpx.AsyncClient) -> None:
    client = stack.client(ALPHA)
    f = await upload(client, jsonl(2))
    deleted = await client.files.delete(f.id)
    assert isinstance(deleted, FileDeleted)
    assert deleted.id == f.id and deleted.deleted is True and deleted.object == "file"

    for path in (f"/v1/files/{f.id}", f"/v1/files/{f.id}/content"):
        assert_error(await http.get(path, headers=auth()), 404, param="id", code="file_not_found")
    assert_error(
        await http.delete(f"/v1/files/{f.id}", headers=auth()),
        404,
        param="id",
        code="file_not_found",
    )
    with pytest.raises(openai.NotFoundError):
        await client.files.retrieve(f.id)
    assert f.id not in {x.id async for x in client.files.list()}
    assert not any(name.startswith(f.id) for name in stored_names(stack))


# ---- bad uploads -------------------------------------------------------------------------------


async def test_purpose_other_than_batch_is_400(stack: Stack, http: httpx.AsyncClient) -> None:
    before = stored_names(stack)
    for purpose in ("fine-tune", "assistants", "batch_output", ""):
        resp = await http.post(
            "/v1/files",
            headers=auth(),
            data={"purpose": purpose},
            files={"file": ("x.jsonl", jsonl(1))},
        )
        assert_error(resp, 400, param="purpose")
    # purpose missing altogether
    resp = await http.post("/v1/files", headers=auth(), files={"file": ("x.jsonl", jsonl(1))})
    assert_error(resp, 400, param="purpose")
    with pytest.raises(openai.BadRequestError) as exc:
        await stack.client(ALPHA).files.create(file=("x.jsonl", jsonl(1)), purpose="fine-tune")
    assert exc.value.status_code == 400 and exc.value.param == "purpose"
    # Nothing was kept: no file object, no temp file.
    assert stored_names(stack) == before


async def test_missing_file_part_is_400(stack: Stack, http: httpx.AsyncClient) -> None:
    before = stored_names(stack)
    # multipart with only the purpose field
    resp = await http.post("/v1/files", headers=auth(), files={"purpose": (None, "batch")})
    assert_error(resp, 400, param="file")
    # a "file" field sent as a plain form value, not as a file
    resp = await http.post(
        "/v1/files", headers=auth(), files={"purpose": (None, "batch"), "file": (None, "abc")}
    )
    assert_error(resp, 400, param="file")
    assert stored_names(stack) == before


async def test_non_multipart_body_is_400(stack: Stack, http: httpx.AsyncClient) -> None:
    before = stored_names(stack)
    for kwargs in (
        {"json": {"purpose": "batch", "file": "abc"}},
        {"data": {"purpose": "batch"}},  # application/x-www-form-urlencoded
        {"content": b"", "headers": {}},
        {"content": b"--x\r\n", "headers": {"Content-Type": "multipart/form-data"}},  # no boundary
    ):
        headers = {**auth(), **kwargs.pop("headers", {})}  # type: ignore[dict-item]
        resp = await http.post("/v1/files", headers=headers, **kwargs)  # type: ignore[arg-type]
        assert_error(resp, 400, param="file")
    # multipart/form-data with a boundary but a garbage body
    resp = await http.post(
        "/v1/files",
        headers={**auth(), "Content-Type": "multipart/form-data; boundary=abc"},
        content=b"this is not multipart at all",
    )
    assert_error(resp, 400, param="file")
    assert stored_names(stack) == before


@pytest.mark.store  # also run on the S3 store by `make test` (tests/e2e/stack.py)
async def test_two_file_parts_are_refused_not_concatenated(
    stack: Stack, http: httpx.AsyncClient
) -> None:
    before = stored_names(stack)
    resp = await http.post(
        "/v1/files",
        headers=auth(),
        files=[
            ("purpose", (None, "batch")),
            ("file", ("one.jsonl", b'{"a": 1}\n')),
            ("file", ("two.jsonl", b'{"b": 2}\n')),
        ],
    )
    assert_error(resp, 400, param="file")
    assert stored_names(stack) == before


@pytest.mark.store  # also run on the S3 store by `make test` (tests/e2e/stack.py)
async def test_client_disconnect_mid_upload_leaves_no_temp_file(stack: Stack) -> None:
    boundary = "dropboundary42"
    head = (
        f"--{boundary}\r\n"
        'Content-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        f"--{boundary}\r\n"
        'Content-Disposition: form-data; name="file"; filename="dropped.jsonl"\r\n\r\n'
    ).encode()
    never = asyncio.Event()

    async def body() -> AsyncIterator[bytes]:
        yield head
        for _ in range(12):  # more than one S3 part (5 MiB in the e2e runs): some is stored
            yield b"x" * MiB
        await never.wait()  # the client stalls mid-file, then goes away
        yield b""

    def temp_files() -> dict[str, int]:
        return stack.store().pending_uploads()

    before = stored_names(stack)
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=60, trust_env=False) as http:
        task = asyncio.create_task(
            http.post(
                "/v1/files",
                headers={**auth(), "Content-Type": f"multipart/form-data; boundary={boundary}"},
                content=body(),
            )
        )

        def upload_started() -> bool:
            assert not task.done(), task.result().text
            return any(size > 0 for size in temp_files().values())

        await poll_until(
            upload_started, timeout=20, what="the upload to reach the store", interval=0.02
        )
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    # The connection is gone: the server aborts the upload and removes its temp file.
    await poll_until(
        temp_files,
        lambda left: not left,
        timeout=20,
        what="the aborted upload's temp file to be removed",
        interval=0.02,
    )
    assert stored_names(stack) == before


# ---- size cap ----------------------------------------------------------------------------------


@pytest.mark.store  # also run on the S3 store by `make test` (tests/e2e/stack.py)
async def test_cap_boundary_exact_size_accepted_one_more_byte_refused(small_stack: Stack) -> None:
    client = small_stack.client(ALPHA)
    exact = b"x" * 1_000_000
    f = await upload(client, exact)
    assert f.bytes == 1_000_000
    assert (await client.files.content(f.id)).content == exact
    before = stored_names(small_stack)

    async with httpx.AsyncClient(base_url=small_stack.api_url, timeout=60) as http:
        resp = await http.post(
            "/v1/files",
            headers=auth(),
            data={"purpose": "batch"},
            files={"file": ("big.jsonl", exact + b"y")},
        )
    assert_error(resp, 413, param="file", code="file_too_large")
    with pytest.raises(openai.APIStatusError) as exc:
        await upload(client, b"z" * 1_500_000)
    assert exc.value.status_code == 413
    assert stored_names(small_stack) == before
    assert [x.id async for x in client.files.list()] == [f.id]


def _peak_rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@pytest.mark.store  # also run on the S3 store by `make test` (tests/e2e/stack.py)
async def test_201_mib_upload_is_refused_while_streaming_and_leaves_nothing(
    stack: Stack, http: httpx.AsyncClient
) -> None:
    """With the default 200 MiB cap; the body is a generator (chunked, no Content-Length), so
    the server can only refuse it by counting while it streams."""
    assert stack.api.pid is not None
    size = 201 * MiB
    assert size > DEFAULT_CAP
    boundary = "capboundary7d1f"
    head = (
        f"--{boundary}\r\n"
        'Content-Disposition: form-data; name="purpose"\r\n\r\n'
        "batch\r\n"
        f"--{boundary}\r\n"
        'Content-Disposition: form-data; name="file"; filename="huge.jsonl"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    tail = f"\r\n--{boundary}--\r\n".encode()
    chunk = (b'{"custom_id":"x"}\n' * 60_000)[:MiB]
    sent = 0

    async def body() -> AsyncIterator[bytes]:
        nonlocal sent
        yield head
        for _ in range(size // MiB):
            sent += len(chunk)
            yield chunk
        yield tail

    before = stored_names(stack)
    peak_before = _peak_rss_bytes(stack.api.pid)
    resp = await http.post(
        "/v1/files",
        headers={**auth(), "Content-Type": f"multipart/form-data; boundary={boundary}"},
        content=body(),
    )
    assert sent == size
    err = assert_error(resp, 413, param="file", code="file_too_large")
    assert str(DEFAULT_CAP) in err["message"]
    # No temp file and no data file left behind, and nothing listed.
    assert stored_names(stack) == before
    assert stack.store().pending_uploads() == {}
    listed = (await http.get("/v1/files", headers=auth(), params={"limit": 10_000})).json()
    assert "huge.jsonl" not in {f["filename"] for f in listed["data"]}
    # Streamed, not buffered: the api's peak memory grew by far less than the upload. Buffering
    # would add at least 201 MiB; the limit is half of that, leaving room for the allocator and
    # for whatever else the api did meanwhile (how little it grows is a bench figure).
    assert _peak_rss_bytes(stack.api.pid) - peak_before < size // 2
    # The api is fine afterwards, on the same connection pool.
    ok = await http.post(
        "/v1/files",
        headers=auth(),
        data={"purpose": "batch"},
        files={"file": ("after.jsonl", jsonl(1))},
    )
    assert ok.status_code == 200, ok.text
    assert (await http.get("/healthz")).json() == {
        "status": "ok",
        "live_proxy": "ok",
        "temporal": "ok",
    }


# ---- auth and isolation ------------------------------------------------------------------------


async def test_missing_or_bad_api_key_is_401(stack: Stack, http: httpx.AsyncClient) -> None:
    f = await upload(stack.client(ALPHA), jsonl(1))
    bad_headers: list[dict[str, str]] = [
        {},
        {"Authorization": "Bearer sk-test-nobody"},
        {"Authorization": "Bearer"},
        {"Authorization": "Basic c2stdGVzdC1hbHBoYTo="},
        {"Authorization": "sk-test-alpha"},
    ]
    for headers in bad_headers:
        for method, path in (
            ("GET", "/v1/files"),
            ("GET", f"/v1/files/{f.id}"),
            ("GET", f"/v1/files/{f.id}/content"),
            ("DELETE", f"/v1/files/{f.id}"),
            ("GET", "/v1/batches"),
        ):
            resp = await http.request(method, path, headers=headers)
            assert_error(resp, 401, code="invalid_api_key")
        resp = await http.post(
            "/v1/files", headers=headers, data={"purpose": "batch"}, files={"file": ("a", b"x")}
        )
        assert_error(resp, 401, code="invalid_api_key")
    with pytest.raises(openai.AuthenticationError) as exc:
        await stack.client("sk-test-nobody").files.list()
    assert exc.value.status_code == 401 and exc.value.code == "invalid_api_key"
    # the file is untouched
    assert (await stack.client(ALPHA).files.retrieve(f.id)).id == f.id


@pytest.mark.store  # also run on the S3 store by `make test` (tests/e2e/stack.py)
async def test_another_workspaces_file_is_404_and_not_listed(
    stack: Stack, http: httpx.AsyncClient
) -> None:
    alpha, beta = stack.client(ALPHA), stack.client(BETA)
    f = await upload(alpha, jsonl(1), "alpha-secret.jsonl")
    own = await upload(beta, jsonl(1), "beta-own.jsonl")
    for path in (f"/v1/files/{f.id}", f"/v1/files/{f.id}/content"):
        assert_error(
            await http.get(path, headers=auth(BETA)), 404, param="id", code="file_not_found"
        )
    assert_error(
        await http.delete(f"/v1/files/{f.id}", headers=auth(BETA)),
        404,
        param="id",
        code="file_not_found",
    )
    with pytest.raises(openai.NotFoundError):
        await beta.files.content(f.id)
    beta_ids = {x.id async for x in beta.files.list()}
    assert own.id in beta_ids and f.id not in beta_ids
    # Paging after another workspace's id is refused like an unknown id.
    assert_error(
        await http.get("/v1/files", headers=auth(BETA), params={"after": f.id}), 400, param="after"
    )
    # Still there for its owner (beta's delete did nothing), and for a platform admin.
    assert (await alpha.files.content(f.id)).content == jsonl(1)
    assert f.id in {x.id async for x in alpha.files.list()}
    assert own.id not in {x.id async for x in alpha.files.list()}
    assert (await stack.client(ADMIN).files.retrieve(f.id)).filename == "alpha-secret.jsonl"


async def test_unknown_route_and_wrong_method_use_the_envelope(http: httpx.AsyncClient) -> None:
    assert_error(await http.get("/v1/nothing-here", headers=auth()), 404)
    resp = await http.put("/v1/files", headers=auth())
    assert resp.status_code == 405, resp.text
    assert set(resp.json()["error"]) == {"message", "type", "param", "code"}


# ---- health and metrics ------------------------------------------------------------------------


async def test_healthz_and_metrics(http: httpx.AsyncClient) -> None:
    resp = await http.get("/healthz")
    assert resp.status_code == 200 and resp.json() == {
        "status": "ok",
        "live_proxy": "ok",
        "temporal": "ok",
    }
    # Every workspace's names and counts: not for a member's key.
    assert_error(await http.get("/metrics"), 401, code="invalid_api_key")
    resp = await http.get("/metrics", headers=auth())
    assert_error(resp, 403, code="insufficient_role", type_="permission_error")
    resp = await http.get("/metrics", headers=auth("sk-test-auditor"))
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain")
    assert "# TYPE " in resp.text and "# HELP " in resp.text


@pytest.mark.store  # also run on the S3 store by `make test` (tests/e2e/stack.py)
async def test_a_large_file_uploads_and_downloads_streamed(
    stack: Stack, http: httpx.AsyncClient
) -> None:
    """120 MiB up and down again: the content comes back byte for byte, in chunks, and the
    api's peak memory grows by far less than the file (it is never held whole, on either
    store: the local store streams from disk, the S3 store from GetObject)."""
    assert stack.api.pid is not None
    size = 120 * MiB
    boundary = "bigboundary3c5e"
    head = (
        f"--{boundary}\r\n"
        'Content-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        f"--{boundary}\r\n"
        'Content-Disposition: form-data; name="file"; filename="large.jsonl"\r\n\r\n'
    ).encode()
    block = (b'{"custom_id":"x"}\n' * 60_000)[:MiB]
    sent = hashlib.sha256()

    async def body() -> AsyncIterator[bytes]:
        yield head
        for i in range(size // MiB):
            chunk = block[:-8] + i.to_bytes(8, "big")  # every MiB different
            sent.update(chunk)
            yield chunk
        yield f"\r\n--{boundary}--\r\n".encode()

    peak_before = _peak_rss_bytes(stack.api.pid)
    resp = await http.post(
        "/v1/files",
        headers={**auth(), "Content-Type": f"multipart/form-data; boundary={boundary}"},
        content=body(),
    )
    assert resp.status_code == 200, resp.text
    file_id = resp.json()["id"]
    assert resp.json()["bytes"] == size
    got = hashlib.sha256()
    received = 0
    async with http.stream("GET", f"/v1/files/{file_id}/content", headers=auth()) as content:
        assert content.status_code == 200
        assert content.headers["content-length"] == str(size)
        assert content.headers["content-disposition"] == 'attachment; filename="large.jsonl"'
        async for chunk in content.aiter_raw():
            got.update(chunk)
            received += len(chunk)
    assert received == size and got.hexdigest() == sent.hexdigest()
    assert _peak_rss_bytes(stack.api.pid) - peak_before < size // 2
    assert (await http.delete(f"/v1/files/{file_id}", headers=auth())).status_code == 200
