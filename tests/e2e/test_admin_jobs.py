"""The administrators' jobs API (`/gateway/ui-api/batches`) on the real stack, for each role:
a platform admin lists every workspace's jobs (filters: workspace, state, model), reads one with
its attempts and identity snapshot, downloads its output and pauses, resumes and cancels it; an
auditor reads but never changes (nor reads content); a member is refused everywhere; an id that
is not a job is a 404."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai.types.chat
import pytest_asyncio

from backfill.platform.config import hash_key
from tests.e2e.stack import Stack, assert_error, auth, submit
from tests.e2e.test_jobs import set_window
from tests.polling import poll_until
from tools.sim import SimConfig

ALPHA, BETA, ADMIN, AUDITOR = "sk-test-alpha", "sk-test-beta", "sk-test-admin", "sk-test-auditor"
JOBS, ADMIN_JOBS = "/gateway/v1/batches", "/gateway/ui-api/batches"
KEYS = (ALPHA, BETA, ADMIN, AUDITOR)


def chat(text: str) -> dict[str, Any]:
    body = {"model": "demo", "messages": [{"role": "user", "content": text}]}
    return {"path": "/v1/chat/completions", "body": body}


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def admin_stack(tmp_path_factory, dev_server) -> AsyncIterator[Stack]:  # type: ignore[no-untyped-def]
    s = Stack(
        tmp_path_factory.mktemp("admin-jobs"),
        dev_server.address,
        cap=1,
        sim=SimConfig(model_names=[], latency_ms=50),
    )
    async with s.running():
        yield s


@pytest_asyncio.fixture(loop_scope="session")
async def http(admin_stack: Stack) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=admin_stack.api_url, timeout=60) as c:
        yield c


async def create(http: httpx.AsyncClient, key: str, request: dict[str, Any]) -> str:
    r = await http.post(JOBS, json=request, headers=auth(key))
    assert r.status_code == 202, r.text
    return r.json()["id"]  # type: ignore[no-any-return]


async def admin_get(http: httpx.AsyncClient, job_id: str, key: str = ADMIN) -> dict[str, Any]:
    r = await http.get(f"{ADMIN_JOBS}/{job_id}", headers=auth(key))
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


async def listed(http: httpx.AsyncClient, key: str = ADMIN, **params: Any) -> list[str]:
    r = await http.get(ADMIN_JOBS, headers=auth(key), params=params)
    assert r.status_code == 200, r.text
    for job in r.json()["data"]:
        assert_no_key(job)
    return [j["id"] for j in r.json()["data"]]


def assert_no_key(job: dict[str, Any]) -> None:
    """Identity metadata, never a key (nor its hash)."""
    text = str(job)
    for key in KEYS:
        assert key not in text and hash_key(key) not in text


async def wait_state(http: httpx.AsyncClient, job_id: str, *states: str) -> dict[str, Any]:
    return await poll_until(
        lambda: admin_get(http, job_id),
        lambda j: j["state"] in states,
        timeout=120,
        what=f"job {job_id} to be {' or '.join(states)}",
    )


async def test_roles_reads_filters_and_output(admin_stack: Stack, http: httpx.AsyncClient) -> None:
    ws = admin_stack.workspaces
    mine = await create(http, ALPHA, chat("alpha"))
    theirs = await create(http, BETA, chat("beta"))
    not_a_job = await submit(admin_stack, 1, key=ALPHA)  # a plain batch of alpha
    done = await wait_state(http, mine, "completed", "failed", "cancelled")
    await wait_state(http, theirs, "completed", "failed", "cancelled")

    # The Job's fields, the workspace and the identity snapshot (the key's id, never the key).
    assert done["state"] == "completed" and done["object"] == "gateway.batch"
    assert (done["attempts"], done["status_code"]) == (1, 200)
    assert done["request_id"].startswith("req_") and done["model"] == "demo"
    assert done["workspace"] == ws["alpha"]
    assert done["identity"] == {
        "workspace": ws["alpha"],
        "key_id": f"key_{hash_key(ALPHA)[:12]}",
        "role": "member",
        "allowed_models": None,
    }
    assert_no_key(done)
    # The auditor reads the same object.
    assert await admin_get(http, mine, AUDITOR) == done

    # Every workspace's jobs, never plain batches; filters by workspace, state and model.
    for key in (ADMIN, AUDITOR):
        everything = await listed(http, key)
        assert mine in everything and theirs in everything and not_a_job not in everything
    assert await listed(http, workspace=ws["alpha"]) == [mine]
    assert await listed(http, workspace=ws["beta"], state="completed") == [theirs]
    assert await listed(http, workspace=ws["beta"], state="queued") == []
    assert await listed(http, workspace=ws["alpha"], model="demo") == [mine]
    assert await listed(http, workspace=ws["alpha"], model="other") == []
    assert await listed(http, workspace=ws["alpha"], limit=1) == [mine]
    r = await http.get(ADMIN_JOBS, headers=auth(ADMIN), params={"state": "in_progress"})
    assert_error(r, 400, param="state")

    # Output: the admin downloads any workspace's; the auditor never reads content.
    r = await http.get(f"{ADMIN_JOBS}/{theirs}/output", headers=auth(ADMIN))
    assert r.status_code == 200, r.text
    assert openai.types.chat.ChatCompletion.model_validate(r.json()).choices
    r = await http.get(f"{ADMIN_JOBS}/{theirs}/output", headers=auth(AUDITOR))
    assert_error(r, 403, code="insufficient_role", type_="permission_error")

    # An id that is not a job: a plain batch, a malformed id, a batch id that never existed.
    for job_id in (not_a_job, "nope", "batch_0000000000000000000000"):
        for path in ("", "/output"):
            r = await http.get(f"{ADMIN_JOBS}/{job_id}{path}", headers=auth(ADMIN))
            assert_error(r, 404, code="job_not_found", param="job_id")
        r = await http.post(f"{ADMIN_JOBS}/{job_id}/cancel", headers=auth(ADMIN))
        assert_error(r, 404, code="job_not_found", param="job_id")

    # A member is refused all six, even on its own job; an auditor may change nothing.
    for method, path in (
        ("GET", ""),
        ("GET", f"/{mine}"),
        ("GET", f"/{mine}/output"),
        ("POST", f"/{mine}/pause"),
        ("POST", f"/{mine}/resume"),
        ("POST", f"/{mine}/cancel"),
    ):
        r = await http.request(method, ADMIN_JOBS + path, headers=auth(ALPHA))
        assert_error(r, 403, code="insufficient_role", type_="permission_error")
    for action in ("pause", "resume", "cancel"):
        r = await http.post(f"{ADMIN_JOBS}/{theirs}/{action}", headers=auth(AUDITOR))
        assert_error(r, 403, code="read_only", type_="permission_error")
    # A finished job cannot be controlled.
    r = await http.post(f"{ADMIN_JOBS}/{theirs}/pause", headers=auth(ADMIN))
    assert_error(r, 409, code="invalid_job_state")


async def test_admin_pauses_resumes_and_cancels_any_workspace_job(
    admin_stack: Stack, http: httpx.AsyncClient
) -> None:
    ws = admin_stack.workspaces
    await set_window(admin_stack, http, closed=True)  # the job stays queued: nothing runs
    try:
        job_id = await create(http, BETA, chat("held"))
        assert (await admin_get(http, job_id))["state"] == "queued"
        assert job_id in await listed(http, workspace=ws["beta"], state="queued")

        r = await http.post(f"{ADMIN_JOBS}/{job_id}/pause", headers=auth(ADMIN))
        assert r.status_code == 200, r.text
        assert r.json()["state"] == "paused" and r.json()["paused_by"] == "ops-key"
        assert r.json()["identity"]["workspace"] == ws["beta"]
        # The owner sees the same pause through its own API.
        own = await http.get(f"{JOBS}/{job_id}", headers=auth(BETA))
        assert own.json()["state"] == "paused"
        assert await listed(http, workspace=ws["beta"], state="paused") == [job_id]
        assert await listed(http, workspace=ws["beta"], state="queued") == []

        r = await http.post(f"{ADMIN_JOBS}/{job_id}/resume", headers=auth(ADMIN))
        assert r.status_code == 200, r.text
        assert r.json()["state"] == "queued" and r.json()["paused_by"] is None

        r = await http.post(f"{ADMIN_JOBS}/{job_id}/cancel", headers=auth(ADMIN))
        assert r.status_code == 200, r.text
        assert r.json()["state"] in ("cancelling", "cancelled")
        ended = await wait_state(http, job_id, "cancelled")
        assert ended["finished_at"] is not None and ended["attempts"] == 0
        assert await listed(http, workspace=ws["beta"], state="cancelled") == [job_id]
        r = await http.get(f"{ADMIN_JOBS}/{job_id}/output", headers=auth(ADMIN))
        assert_error(r, 409, code="job_not_completed")
    finally:
        await set_window(admin_stack, http, closed=False)
