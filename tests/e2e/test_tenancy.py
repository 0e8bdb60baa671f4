"""Tenancy on the real stack: a key restricted to some models, the identity snapshot a batch
runs under (also after its key is revoked), and workspace limits answered 429."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from temporalio.client import Client

from backfill.platform.config import hash_key
from tests.e2e.conftest import MakeStack
from tests.e2e.stack import Stack, assert_error, auth, jsonl, submit, wait_terminal
from tests.e2e.test_roles_matrix import SCHEDULING, closed_window
from tests.e2e.test_scheduler import wait_scheduler
from tests.polling import poll_until
from tools.dev.procs import backfill_argv
from tools.sim import SimConfig

LIMITED, ALPHA, BETA, ADMIN = "sk-test-limited", "sk-test-alpha", "sk-test-beta", "sk-test-admin"
CHAT = {"model": "demo", "messages": [{"role": "user", "content": "hi"}]}
HELD_STACK: dict[str, Any] = {
    "route_settings": {"time_window": closed_window()},
    "workspace_limits": {
        "alpha": {"max_active_batches": 1, "max_stored_bytes": 2048},
        "gamma": {"max_files": 2},
    },
}
"""The shared stack of the admission and limits tests: its route's settings file keeps it
closed for the session (a one-minute window six hours after the tests were collected), so
every batch made there waits, and is cancelled with its lease; alpha may keep one batch active
and 2 KiB of files, gamma two files (every lease's alpha and gamma: its own workspaces)."""


async def _upload(http: httpx.AsyncClient, key: str, data: bytes) -> httpx.Response:
    return await http.post(
        "/v1/files", headers=auth(key), data={"purpose": "batch"}, files={"file": ("i", data)}
    )


async def _create(http: httpx.AsyncClient, key: str, file_id: str) -> httpx.Response:
    body = {
        "input_file_id": file_id,
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }
    return await http.post("/v1/batches", headers=auth(key), json=body)


async def _started_input(client: Client, batch_id: str) -> dict[str, Any]:
    history = await client.get_workflow_handle(batch_id).fetch_history()
    started = history.events[0].workflow_execution_started_event_attributes
    return json.loads(started.input.payloads[0].data)  # type: ignore[no-any-return]


async def test_restricted_key(shared_stack: Stack, temporal_client: Client) -> None:
    """A key limited to model `other` may not use `demo`: its batch fails validation
    (`unknown_model` on every line), its live request is 404 as for an unknown model, and `demo` is
    not in its model list. The batch's input holds the identity snapshot."""
    stack = shared_stack
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=60) as http:
        models = (await http.get("/v1/models", headers=stack.auth(LIMITED))).json()["data"]
        assert models == []
        everyone = (await http.get("/v1/models", headers=stack.auth(ALPHA))).json()["data"]
        assert [m["id"] for m in everyone] == ["demo"]
        resp = await http.get("/v1/models/demo", headers=stack.auth(LIMITED))
        assert_error(resp, 404, param="model", code="model_not_found")
        resp = await http.post("/v1/chat/completions", headers=stack.auth(LIMITED), json=CHAT)
        assert_error(resp, 404, param="model", code="model_not_found")
        assert (
            await http.post("/v1/chat/completions", headers=stack.auth(ALPHA), json=CHAT)
        ).is_success

        file_id = (await _upload(http, stack.key(LIMITED), jsonl(2, model="demo"))).json()["id"]
        created = await _create(http, stack.key(LIMITED), file_id)
        assert created.status_code == 200, created.text
        batch_id = created.json()["id"]
    batch = await wait_terminal(stack.client(LIMITED), batch_id, within=120)
    assert batch.status == "failed", batch
    assert [(e.code, e.line, e.param) for e in batch.errors.data] == [
        ("unknown_model", 1, "body.model"),
        ("unknown_model", 2, "body.model"),
    ]
    assert "you do not have access" in batch.errors.data[0].message
    snapshot = await _started_input(temporal_client, batch_id)
    assert snapshot["workspace"] == stack.workspaces["limited"]
    assert snapshot["allowed_models"] == ["other"]
    assert snapshot["role"] == "member"
    assert snapshot["key_id"] == f"key_{hash_key(stack.key(LIMITED))[:12]}"
    assert stack.key(LIMITED) not in json.dumps(snapshot)


async def test_revoked_key_does_not_stop_an_accepted_batch(stack: Stack) -> None:
    """Alpha's batch is accepted and held; then alpha's key is removed from the config and the
    api and worker restart. The key is refused from then on, and the batch still completes."""
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=60) as http:
        url = SCHEDULING.format(route=stack.route_id)
        held = {"max_concurrent_lines": 4, "time_window": closed_window()}
        assert (await http.put(url, headers=auth(ADMIN), json=held)).status_code == 200
        file_id = (await _upload(http, ALPHA, jsonl(3))).json()["id"]
        batch_id = (await _create(http, ALPHA, file_id)).json()["id"]

        # Revoke: alpha's entry now holds a hash no key has.
        text = stack.config_path.read_text()
        assert hash_key(ALPHA) in text
        stack.config_path.write_text(text.replace(hash_key(ALPHA), "0" * 64))
        for child in (stack.api, *stack.workers):
            await asyncio.to_thread(child.stop)
        stack.workers.clear()
        stack.start_worker()
        stack.api.start(backfill_argv("api"), stack.env(), stack.tmp / "api2.log")
        await stack.wait_healthy()

        resp = await http.get(f"/v1/batches/{batch_id}", headers=auth(ALPHA))
        assert_error(resp, 401, code="invalid_api_key")
        opened = {"max_concurrent_lines": 4, "time_window": None}
        # The settings update is answered by the route's scheduler, on the worker that just
        # restarted: until it polls (it first replays the scheduler), the api answers 503.
        reopened = await poll_until(
            lambda: http.put(url, headers=auth(ADMIN), json=opened),
            lambda r: r.status_code != 503,
            timeout=60,
            what="the restarted worker to answer the route's settings update",
        )
        assert reopened.status_code == 200, reopened.text
        done = await poll_until(
            lambda: http.get(f"/api/v1/admin/batches/{batch_id}", headers=auth(ADMIN)),
            lambda r: r.json()["status"] in ("completed", "failed", "cancelled", "expired"),
            timeout=120,
            what="the revoked key's batch to end",
        )
    batch = done.json()
    assert batch["status"] == "completed" and batch["request_counts"]["completed"] == 3, batch


async def test_workspace_limits(lease_stack: MakeStack) -> None:
    """Alpha may keep one batch queued or running and 2 KiB of files; beyond either it gets
    429 in OpenAI's envelope, and what it had is unchanged. Beta (no limits) is unaffected."""
    stack = await lease_stack(**HELD_STACK)
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=60) as http:
        small = jsonl(3)
        assert len(small) < 1024
        first = await _upload(http, stack.key(ALPHA), small)
        assert first.status_code == 200, first.text
        too_big = jsonl(30)
        assert len(too_big) > 2048 - len(small)
        resp = await _upload(http, stack.key(ALPHA), too_big)
        assert_error(resp, 429, code="storage_limit_exceeded", type_="rate_limit_error")
        files = (await http.get("/v1/files", headers=stack.auth(ALPHA))).json()["data"]
        assert [f["id"] for f in files] == [first.json()["id"]]

        file_id = first.json()["id"]
        created = await _create(http, stack.key(ALPHA), file_id)
        assert created.status_code == 200, created.text
        batch_id = created.json()["id"]
        # Visibility lists the batch once its start is indexed: the limit counts from there.
        await poll_until(
            lambda: http.get("/v1/batches", headers=stack.auth(ALPHA)),
            lambda r: [b["id"] for b in r.json()["data"]] == [batch_id],
            timeout=30,
            what="the first batch listed",
        )
        resp = await _create(http, stack.key(ALPHA), file_id)
        assert_error(resp, 429, code="batch_limit_exceeded", type_="rate_limit_error")
        listed = (await http.get("/v1/batches", headers=stack.auth(ALPHA))).json()["data"]
        assert [(b["id"], b["status"]) for b in listed] in (
            [(batch_id, "validating")],
            [(batch_id, "in_progress")],
        )
        # Beta has no limits.
        beta_file = (await _upload(http, stack.key(BETA), too_big)).json()["id"]
        for _ in range(2):
            assert (await _create(http, stack.key(BETA), beta_file)).status_code == 200


async def test_share_weight_splits_a_route(make_stack: MakeStack, temporal_client: Client) -> None:
    """Alpha (share weight 3) and beta (default 1) both want more lines than the route's cap
    of 4: the scheduler gives alpha 3 slots and beta 1."""
    stack = await make_stack(
        cap=4,
        sim=SimConfig(model_names=[], latency_ms=300),
        workspace_limits={"alpha": {"share_weight": 3}},
    )
    heavy = await submit(stack, 200, key=ALPHA, prefix="heavy")
    light = await submit(stack, 200, key=BETA, prefix="light")
    st = await wait_scheduler(
        temporal_client,
        stack.route_id,
        lambda s: {b.batch_id: b.allotment for b in s.batches} == {heavy: 3, light: 1},
        "allotments 3:1 by share weight",
    )
    assert sum(b.allotment for b in st.batches) == 4


async def test_parallel_creates_admit_exactly_the_limit(lease_stack: MakeStack) -> None:
    """With `max_active_batches = 1`, 20 creates at once make exactly one batch: admission is
    counted by the workspace's admission workflow, not by the lagging visibility index."""
    stack = await lease_stack(**HELD_STACK)
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=60) as http:
        file_id = (await _upload(http, stack.key(ALPHA), jsonl(3))).json()["id"]

        # 20 connections open first, so the creates arrive together rather than as connected.
        alpha = stack.auth(ALPHA)
        await asyncio.gather(*(http.get("/v1/files", headers=alpha) for _ in range(20)))
        answers = await asyncio.gather(
            *(_create(http, stack.key(ALPHA), file_id) for _ in range(20))
        )
        made = [r.json()["id"] for r in answers if r.status_code == 200]
        assert len(made) == 1, [(r.status_code, r.text[:80]) for r in answers]
        for r in answers:
            if r.status_code != 200:
                assert_error(r, 429, code="batch_limit_exceeded", type_="rate_limit_error")
        listed = await poll_until(
            lambda: http.get("/v1/batches", headers=stack.auth(ALPHA)),
            lambda r: r.json()["data"],
            timeout=30,
            what="the batch listed",
        )
        assert [b["id"] for b in listed.json()["data"]] == made


@pytest.mark.store  # also run on the S3 store by `make test` (tests/e2e/stack.py)
async def test_pinned_input_counts_towards_stored_bytes(lease_stack: MakeStack) -> None:
    """Upload, create a batch, delete the file: the batch's pinned copy stays stored, so the
    bytes still count and the next upload that would pass the limit with them is refused."""
    small = jsonl(9)
    limit = HELD_STACK["workspace_limits"]["alpha"]["max_stored_bytes"]
    assert len(small) <= limit < 2 * len(small)  # one fits, the pinned copy and one more not
    stack = await lease_stack(**HELD_STACK)
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=60) as http:
        file_id = (await _upload(http, stack.key(ALPHA), small)).json()["id"]
        created = await _create(http, stack.key(ALPHA), file_id)
        assert created.status_code == 200, created.text
        deleted = await http.delete(f"/v1/files/{file_id}", headers=stack.auth(ALPHA))
        assert deleted.status_code == 200

        resp = await _upload(http, stack.key(ALPHA), small)
        assert_error(resp, 429, code="storage_limit_exceeded", type_="rate_limit_error")
        assert (await http.get("/v1/files", headers=stack.auth(ALPHA))).json()["data"] == []
        # Beta's quota is its own.
        assert (await _upload(http, stack.key(BETA), small)).status_code == 200


@pytest.mark.store  # also run on the S3 store by `make test` (tests/e2e/stack.py)
async def test_max_files_refuses_an_upload_and_a_job_past_it_in_that_workspace_only(
    lease_stack: MakeStack,
) -> None:
    stack = await lease_stack(**HELD_STACK)
    gamma = stack.key("sk-test-gamma")
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=60) as http:
        kept = [(await _upload(http, gamma, b"{}\n")).json()["id"] for _ in range(2)]
        resp = await _upload(http, gamma, b"{}\n")
        err = assert_error(resp, 429, code="file_limit_exceeded", type_="rate_limit_error")
        assert "2 files" in err["message"], err
        job = await http.post(
            "/gateway/v1/batches",
            headers=auth(gamma),
            json={"path": "/v1/chat/completions", "body": CHAT},
        )
        assert_error(job, 429, code="file_limit_exceeded", type_="rate_limit_error")
        listed = (await http.get("/v1/files", headers=auth(gamma))).json()["data"]
        assert sorted(f["id"] for f in listed) == sorted(kept)  # nothing of the refused stored
        assert (await _upload(http, stack.key(BETA), b"{}\n")).status_code == 200  # its own
        deleted = await http.delete(f"/v1/files/{kept[0]}", headers=auth(gamma))
        assert deleted.status_code == 200
        assert (await _upload(http, gamma, b"{}\n")).status_code == 200  # room again
