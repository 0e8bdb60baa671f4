"""Workspace limits that hold whatever the workers do (issue 40, decision 0027): with every
worker stopped, parallel creates never pass `max_active_batches`/`max_queued_lines` and an upload
under a storage limit is not counted without the pinned inputs (503 with `Retry-After`, never a
guess); once a worker is back, the creates given up on take no slot; and a burst of creates in
one workspace never answers 5xx."""

from __future__ import annotations

import asyncio

import httpx
from temporalio.client import Client

from backfill.batches import search_attributes as sa
from tests.e2e.conftest import MakeStack
from tests.e2e.stack import Stack, assert_error, auth, jsonl
from tests.e2e.test_roles_matrix import SCHEDULING, closed_window
from tests.polling import poll_until

ALPHA, BETA, ADMIN = "sk-test-alpha", "sk-test-beta", "sk-test-admin"
LINES = 3
"""Lines of each batch's input."""
MAX_ACTIVE, MAX_LINES = 3, 7
"""Alpha's limits: by lines, at most two 3-line batches (the third would make 9)."""
BURST = 12
"""Parallel creates: more than the 10 updates Temporal keeps in flight per workflow."""


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


async def _burst(http: httpx.AsyncClient, key: str, file_id: str, n: int) -> list[httpx.Response]:
    # n connections open first, so the creates arrive together rather than as connected.
    await asyncio.gather(*(http.get("/v1/files", headers=auth(key)) for _ in range(n)))
    return list(await asyncio.gather(*(_create(http, key, file_id) for _ in range(n))))


def _assert_unavailable(resp: httpx.Response) -> None:
    """503 `admission_unavailable` in OpenAI's envelope, with a whole-seconds Retry-After."""
    assert_error(resp, 503, code="admission_unavailable", type_="server_error")
    assert int(resp.headers["retry-after"]) > 0, resp.headers


async def _running_batches(temporal: Client, stack: Stack, workspace: str) -> set[str]:
    query = (
        f"WorkflowType = 'BatchWorkflow' AND ExecutionStatus = 'Running' "
        f"AND TaskQueue = '{stack.task_queue}' "
        f"AND {sa.WORKSPACE.name} = '{stack.workspaces[workspace]}'"
    )
    return {ex.id async for ex in temporal.list_workflows(query)}


async def test_limits_hold_while_no_worker_answers(
    make_stack: MakeStack, temporal_client: Client
) -> None:
    small = jsonl(LINES)
    stack = await make_stack(
        workspace_limits={
            "alpha": {"max_active_batches": MAX_ACTIVE, "max_queued_lines": MAX_LINES},
            "beta": {"max_stored_bytes": len(small) + len(small) // 2},
        }
    )
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=60) as http:
        url = SCHEDULING.format(route=stack.route_id)
        held = {"max_concurrent_lines": 4, "time_window": closed_window()}
        assert (await http.put(url, headers=auth(ADMIN), json=held)).status_code == 200
        file_id = (await _upload(http, ALPHA, small)).json()["id"]
        first = await _create(http, ALPHA, file_id)
        assert first.status_code == 200, first.text
        # Beta's batch pins its input; the file itself is deleted.
        pinned = (await _upload(http, BETA, small)).json()["id"]
        assert (await _create(http, BETA, pinned)).status_code == 200
        assert (await http.delete(f"/v1/files/{pinned}", headers=auth(BETA))).status_code == 200

        for worker in stack.workers:
            worker.kill()
        answers, upload = await asyncio.gather(
            _burst(http, ALPHA, file_id, BURST), _upload(http, BETA, small)
        )
        made = [r.json()["id"] for r in answers if r.status_code == 200]
        # The invariant: never past either limit, whatever answered.
        assert 1 + len(made) <= MAX_ACTIVE and LINES * (1 + len(made)) <= MAX_LINES, [
            (r.status_code, r.text[:100]) for r in answers
        ]
        # No count to go by: every create is refused, saying when to come back.
        for r in answers:
            _assert_unavailable(r)
        # The pinned input is not left out of beta's storage count: refused, not stored.
        _assert_unavailable(upload)
        assert (await http.get("/v1/files", headers=auth(BETA))).json()["data"] == []

        stack.start_worker()
        back = await poll_until(
            lambda: _upload(http, BETA, small),
            lambda r: r.status_code != 503,
            timeout=60,
            what="beta's upload counted again (a worker answers the admission)",
        )
        assert_error(back, 429, code="storage_limit_exceeded", type_="rate_limit_error")

        # The creates given up on hold no slot once their updates are decided: exactly one more
        # 3-line batch fits under 7 lines.
        answers = await _burst(http, ALPHA, file_id, BURST)
        made = [r.json()["id"] for r in answers if r.status_code == 200]
        assert len(made) == 1, [(r.status_code, r.text[:100]) for r in answers]
        for r in answers:
            if r.status_code != 200:
                assert_error(r, 429, code="line_limit_exceeded", type_="rate_limit_error")
        expected = {first.json()["id"], *made}
        await poll_until(
            lambda: _running_batches(temporal_client, stack, "alpha"),
            lambda ids: ids == expected,
            timeout=30,
            what="alpha's two batches, and only them, running",
        )


async def test_a_burst_of_creates_never_answers_5xx(make_stack: MakeStack) -> None:
    """Forty creates at once in one workspace, every limit far away: every one is a batch."""
    stack = await make_stack()
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=60) as http:
        url = SCHEDULING.format(route=stack.route_id)
        held = {"max_concurrent_lines": 4, "time_window": closed_window()}
        assert (await http.put(url, headers=auth(ADMIN), json=held)).status_code == 200
        file_id = (await _upload(http, ALPHA, jsonl(2))).json()["id"]
        answers = await _burst(http, ALPHA, file_id, 40)
        assert [r.status_code for r in answers] == [200] * 40, [
            (r.status_code, r.text[:100]) for r in answers if r.status_code != 200
        ]
