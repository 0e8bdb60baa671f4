"""Single durable jobs (`/gateway/v1/batches`) on the real stack: a job runs to `completed` and
serves the backend's answer; a backend 400 fails it terminally; pause, resume and cancel while
the route's time window holds it queued; paging; another workspace gets 404 everywhere."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import openai.types.chat
import pytest_asyncio

from tests.e2e.stack import Stack, assert_error, auth
from tests.polling import poll_until
from tools.sim import SimConfig

ALPHA, BETA, ADMIN = "sk-test-alpha", "sk-test-beta", "sk-test-admin"
JOBS = "/gateway/v1/batches"
CHAT = "/v1/chat/completions"


def chat(text: str, **extra: Any) -> dict[str, Any]:
    return {
        "path": CHAT,
        "body": {"model": "demo", "messages": [{"role": "user", "content": text}], **extra},
    }


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def jobs_stack(tmp_path_factory, dev_server) -> AsyncIterator[Stack]:  # type: ignore[no-untyped-def]
    s = Stack(
        tmp_path_factory.mktemp("jobs"),
        dev_server.address,
        cap=1,
        sim=SimConfig(model_names=[], latency_ms=50),
    )
    async with s.running():
        yield s


@pytest_asyncio.fixture(loop_scope="session")
async def http(jobs_stack: Stack) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=jobs_stack.api_url, timeout=60) as c:
        yield c


async def create(http: httpx.AsyncClient, request: dict[str, Any]) -> dict[str, Any]:
    r = await http.post(JOBS, json=request, headers=auth(ALPHA))
    assert r.status_code == 202, r.text
    job: dict[str, Any] = r.json()
    assert r.headers["location"] == f"{JOBS}/{job['id']}"
    assert job["object"] == "gateway.batch" and job["path"] == request["path"]
    assert (job["state"], job["attempts"], job["request_id"], job["status_code"]) == (
        "queued",
        0,
        None,
        None,
    )
    return job


async def get(http: httpx.AsyncClient, job_id: str) -> dict[str, Any]:
    r = await http.get(f"{JOBS}/{job_id}", headers=auth(ALPHA))
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


async def wait_state(http: httpx.AsyncClient, job_id: str, *states: str) -> dict[str, Any]:
    return await poll_until(
        lambda: get(http, job_id),
        lambda j: j["state"] in states,
        timeout=120,
        what=f"job {job_id} to be {' or '.join(states)}",
    )


async def control(http: httpx.AsyncClient, job_id: str, action: str) -> httpx.Response:
    return await http.post(f"{JOBS}/{job_id}/{action}", headers=auth(ALPHA))


async def set_window(stack: Stack, http: httpx.AsyncClient, closed: bool) -> None:
    """Close the route (a one-minute window 12 hours from now) or open it again."""
    window = None
    if closed:
        start = datetime.now(UTC) + timedelta(hours=12)
        window = {
            "time_zone": "UTC",
            "days": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"],
            "from": start.strftime("%H:%M"),
            "until": (start + timedelta(minutes=1)).strftime("%H:%M"),
        }
    url = f"/api/v1/platform/deployments/{stack.route_id}/batch-scheduling"
    r = await http.put(
        url, json={"max_concurrent_lines": 1, "time_window": window}, headers=auth(ADMIN)
    )
    assert r.status_code == 200, r.text


async def test_a_job_completes_and_serves_the_backend_answer(
    jobs_stack: Stack, http: httpx.AsyncClient
) -> None:
    job = await create(http, {**chat("hello"), "metadata": {"team": "a"}})
    assert job["metadata"] == {"team": "a"} and job["created_at"] > 0
    done = await wait_state(http, job["id"], "completed", "failed", "cancelled")
    assert done["state"] == "completed", done
    assert (done["attempts"], done["status_code"], done["error"]) == (1, 200, None)
    assert done["request_id"].startswith("req_") and done["finished_at"] >= done["created_at"]
    assert done["model"] == "demo"

    r = await http.get(f"{JOBS}/{job['id']}/output", headers=auth(ALPHA))
    assert r.status_code == 200, r.text
    answer = openai.types.chat.ChatCompletion.model_validate(r.json())
    assert answer.choices and answer.model == "demo"

    # It is a batch underneath: the Batches API shows it, marked.
    client = jobs_stack.client(ALPHA)
    batch = await client.batches.retrieve(job["id"])
    assert batch.status == "completed" and batch.metadata == {"team": "a", "backfill_job": "1"}
    assert batch.request_counts is not None and batch.request_counts.completed == 1

    listed = (await http.get(JOBS, headers=auth(ALPHA))).json()
    assert [j for j in listed["data"] if j["id"] == job["id"]] == [done]

    # Another workspace sees no such job, whatever it asks.
    for method, path in [
        ("GET", f"{JOBS}/{job['id']}"),
        ("GET", f"{JOBS}/{job['id']}/output"),
        ("POST", f"{JOBS}/{job['id']}/pause"),
        ("POST", f"{JOBS}/{job['id']}/resume"),
        ("POST", f"{JOBS}/{job['id']}/cancel"),
    ]:
        r = await http.request(method, path, headers=auth(BETA))
        assert_error(r, 404, param="job_id", code="job_not_found")
    beta_list = (await http.get(JOBS, headers=auth(BETA))).json()
    assert beta_list["data"] == [] and beta_list["has_more"] is False

    # A plain batch is not a job.
    plain = await client.files.create(
        file=(
            "in.jsonl",
            b'{"custom_id":"a","method":"POST","url":"/v1/chat/completions",'
            b'"body":{"model":"demo","messages":[{"role":"user","content":"x"}]}}\n',
        ),
        purpose="batch",
    )
    plain_batch = await client.batches.create(
        input_file_id=plain.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    r = await http.get(f"{JOBS}/{plain_batch.id}", headers=auth(ALPHA))
    assert_error(r, 404, param="job_id", code="job_not_found")
    listed = (await http.get(JOBS, headers=auth(ALPHA))).json()
    assert plain_batch.id not in [j["id"] for j in listed["data"]]


async def test_a_backend_400_fails_the_job_after_one_attempt(http: httpx.AsyncClient) -> None:
    job = await create(http, chat("bad", max_tokens=-1))  # the backend refuses it, not we
    failed = await wait_state(http, job["id"], "completed", "failed", "cancelled")
    assert failed["state"] == "failed", failed
    assert (failed["attempts"], failed["status_code"]) == (1, 400)
    assert failed["request_id"].startswith("req_")
    assert failed["error"]["code"] == "http_400" and "max_tokens" in failed["error"]["message"]

    r = await http.get(f"{JOBS}/{job['id']}/output", headers=auth(ALPHA))
    assert_error(r, 409, code="job_failed")
    assert_error(await control(http, job["id"], "resume"), 409, code="invalid_job_state")
    assert_error(await control(http, job["id"], "cancel"), 409, code="invalid_job_state")


async def test_pause_resume_and_cancel_a_queued_job(
    jobs_stack: Stack, http: httpx.AsyncClient
) -> None:
    await set_window(jobs_stack, http, closed=True)
    try:
        held = await create(http, chat("held"))
        dropped = await create(http, chat("dropped"))
        assert (await wait_state(http, held["id"], "queued"))["attempts"] == 0
        r = await http.get(f"{JOBS}/{held['id']}/output", headers=auth(ALPHA))
        assert_error(r, 409, code="job_not_completed")

        r = await control(http, held["id"], "pause")
        assert r.status_code == 200, r.text
        assert r.json()["state"] == "paused" and r.json()["paused_by"] == "alpha-key"

        r = await control(http, dropped["id"], "cancel")
        assert r.status_code == 200, r.text
        assert r.json()["state"] in ("cancelling", "cancelled")
        cancelled = await wait_state(http, dropped["id"], "cancelled", "completed", "failed")
        assert cancelled["state"] == "cancelled" and cancelled["attempts"] == 0
        r = await http.get(f"{JOBS}/{dropped['id']}/output", headers=auth(ALPHA))
        assert_error(r, 409, code="job_not_completed")
        assert_error(await control(http, dropped["id"], "pause"), 409, code="invalid_job_state")
    finally:
        await set_window(jobs_stack, http, closed=False)

    # The route is open again: a new job runs through it, the paused one stays held.
    sent_before = jobs_stack.sim.app.stats_dict()["requests_total"]
    passer = await create(http, chat("passes"))
    assert (await wait_state(http, passer["id"], "completed", "failed"))["state"] == "completed"
    assert jobs_stack.sim.app.stats_dict()["requests_total"] == sent_before + 1
    still = await get(http, held["id"])
    assert (still["state"], still["attempts"], still["request_id"]) == ("paused", 0, None)

    r = await control(http, held["id"], "resume")
    assert r.status_code == 200, r.text
    assert r.json()["state"] in ("queued", "running", "completed") and r.json()["paused_by"] is None
    done = await wait_state(http, held["id"], "completed", "failed", "cancelled")
    assert (done["state"], done["attempts"], done["status_code"]) == ("completed", 1, 200)

    # Newest first, paged: the three jobs of this test, one page at a time.
    ids: list[str] = []
    after: str | None = None
    for _ in range(3):
        params: dict[str, Any] = {"limit": 1, **({"after": after} if after else {})}
        page = (await http.get(JOBS, params=params, headers=auth(ALPHA))).json()
        assert len(page["data"]) == 1 and page["first_id"] == page["last_id"]
        assert page["has_more"] is True or len(ids) == 2, page
        ids.append(page["data"][0]["id"])
        after = page["last_id"]
    assert ids == [passer["id"], dropped["id"], held["id"]]
