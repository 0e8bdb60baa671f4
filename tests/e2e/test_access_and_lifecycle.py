"""Promised paths of the api on the real stack: management API roles, controls on another
workspace's batch, listing with no worker running, cancel while validating, and a workflow that
fails being reported `failed`."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
from temporalio.client import Client
from temporalio.common import SearchAttributePair, TypedSearchAttributes

from backfill.batches import search_attributes as sa
from backfill.platform.ids import new_batch_id
from tests.e2e.conftest import MakeStack
from tests.e2e.stack import (
    Stack,
    assert_error,
    auth,
    output_ids,
    submit,
    wait_terminal,
)
from tests.polling import poll_until
from tests.workflows.events import activity_names
from workflows.batch import BatchInput, BatchWorkflow

ALPHA, BETA, ADMIN, AUDITOR = "sk-test-alpha", "sk-test-beta", "sk-test-admin", "sk-test-auditor"


async def test_management_api_roles(stack: Stack) -> None:
    url = f"{stack.api_url}/api/v1/platform/deployments/{stack.route_id}/batch-scheduling"
    body = {"max_concurrent_lines": 3}
    async with httpx.AsyncClient(timeout=60) as http:
        # A member may neither read nor change a route's scheduling.
        assert_error(
            await http.get(url, headers=auth(ALPHA)),
            403,
            code="insufficient_role",
            type_="permission_error",
        )
        assert_error(
            await http.put(url, headers=auth(ALPHA), json=body),
            403,
            code="insufficient_role",
            type_="permission_error",
        )
        # An auditor reads, but may not change.
        r = await http.get(url, headers=auth(AUDITOR))
        assert r.status_code == 200, r.text
        assert r.json()["settings"]["max_concurrent_lines"] == stack.cap
        assert_error(
            await http.put(url, headers=auth(AUDITOR), json=body),
            403,
            code="insufficient_role",
            type_="permission_error",
        )
        # The admin changes it, and the auditor sees the change.
        r = await http.put(url, headers=auth(ADMIN), json=body)
        assert r.status_code == 200, r.text
        r = await http.get(url, headers=auth(AUDITOR))
        assert r.json()["settings"]["max_concurrent_lines"] == 3
        # An unknown route is 404 for whoever may look; an unknown key is 401.
        unknown = f"{stack.api_url}/api/v1/platform/deployments/nope/batch-scheduling"
        for key in (ADMIN, AUDITOR):
            assert_error(await http.get(unknown, headers=auth(key)), 404, param="id")
        assert_error(await http.put(unknown, headers=auth(ADMIN), json=body), 404, param="id")
        for method in ("GET", "PUT"):
            resp = await http.request(method, url, headers=auth("sk-test-nobody"), json=body)
            assert_error(resp, 401, code="invalid_api_key")


async def test_pause_resume_cancel_of_another_workspaces_batch_is_404(
    shared_stack: Stack,
) -> None:
    stack = shared_stack
    batch_id = await submit(stack, 3, key=ALPHA, prefix="own")
    async with httpx.AsyncClient(timeout=60) as http:
        for action in ("pause", "resume", "cancel"):
            resp = await http.post(
                f"{stack.api_url}/v1/batches/{batch_id}/{action}", headers=stack.auth(BETA)
            )
            assert_error(resp, 404, param="batch_id")
    # None of it touched alpha's batch.
    done = await wait_terminal(stack.client(ALPHA), batch_id, within=120)
    assert done.status == "completed" and done.cancelling_at is None, done
    assert done.model_extra and done.model_extra["backfill"]["paused_by"] is None


async def submit_once_admitted(stack: Stack, n: int, *, prefix: str) -> str:
    """`submit`, once a worker just started answers the admission (503 until then)."""
    return await poll_until(
        lambda: submit(stack, n, prefix=prefix),
        timeout=60,
        what="a batch admitted once the worker polls",
        interval=0.5,
        ignore=(openai.InternalServerError,),
    )


async def test_listing_with_no_worker_running(make_stack: MakeStack) -> None:
    """Finished batches list from their results, unfinished ones from their search attributes
    (no worker answers their queries): the page is whole, never an error."""
    stack = await make_stack(workers=0)
    client = stack.client()
    stack.start_worker()
    finished = await submit_once_admitted(stack, 2, prefix="fin")
    assert (await wait_terminal(client, finished, within=120)).status == "completed"
    paused = await submit(stack, 5, prefix="held")
    async with httpx.AsyncClient(timeout=60) as http:
        r = await http.post(f"{stack.api_url}/v1/batches/{paused}/pause", headers=auth())
        assert r.status_code == 200, r.text
    for w in stack.workers:
        await asyncio.to_thread(w.stop)
    page = await poll_until(
        lambda: client.batches.list(limit=10),
        lambda p: [b.id for b in p.data] == [paused, finished],
        timeout=30,
        what="both batches listed, newest first",
    )
    rows = {b.id: b for b in page.data}
    assert rows[finished].status == "completed" and rows[finished].input_file_id  # full row
    assert rows[paused].status in ("validating", "in_progress")  # from search attributes
    # Started again, the worker answers: the paused batch is a full row again.
    stack.start_worker()
    again = await poll_until(
        lambda: client.batches.list(limit=10),
        lambda p: all(b.input_file_id for b in p.data),
        timeout=60,
        what="every row read from its workflow",
    )
    assert [b.id for b in again.data] == [paused, finished]


async def test_cancel_while_validating(make_stack: MakeStack, temporal_client: Client) -> None:
    """The cancel (the operator's signal, `temporal workflow signal --name cancel`) reaches the
    batch before its validation ends, since no worker runs activities yet (a workflows-only
    worker answers the admission and runs the batch's workflow): it ends cancelled, and not one
    line is sent."""
    stack = await make_stack(workers=0)
    stack.start_worker({"BACKFILL_WORKER_ROLE": "workflows"})
    await stack.wait_polled()
    batch_id = await submit_once_admitted(stack, 20, prefix="vcx")
    handle = temporal_client.get_workflow_handle_for(BatchWorkflow.run, batch_id)
    await handle.signal(BatchWorkflow.cancel)
    stack.start_worker({"BACKFILL_WORKER_ROLE": "activities"})
    b = await wait_terminal(stack.client(), batch_id, within=120)
    assert b.status == "cancelled" and b.cancelled_at and b.in_progress_at is None, b
    assert b.request_counts is None or b.request_counts.completed == 0, b
    ids, errors = await output_ids(stack.client(), b)
    assert ids == []
    assert {e["error"]["code"] for e in errors} <= {"batch_cancelled"}
    assert stack.sim.app.stats_dict()["batch"]["by_batch"].get(batch_id, 0) == 0
    # Validation did run (the cancel was taken while it ran, not instead of it).
    history = await handle.fetch_history()
    assert "validate_input" in activity_names(history)
    assert "run_line" not in activity_names(history)


async def test_a_failed_workflow_is_reported_failed(
    shared_stack: Stack, temporal_client: Client
) -> None:
    """A batch whose validation cannot read its pinned input (missing: a permanent store error,
    not an outage to wait out) reads as `failed` with `store_error`, and its workflow run ends
    (completed, the batch failed: decision 0047), not running forever."""
    stack = shared_stack
    ws = stack.workspaces["alpha"]
    batch_id = new_batch_id(int(time.time() * 1000))
    created = int(time.time())
    await temporal_client.start_workflow(
        BatchWorkflow.run,
        BatchInput(
            batch_id=batch_id,
            workspace=ws,
            input_file_id="file-doesnotexist",
            endpoint="/v1/chat/completions",
            completion_window="24h",
            created_at=created,
        ),
        id=batch_id,
        task_queue=stack.task_queue,
        search_attributes=TypedSearchAttributes(
            [
                SearchAttributePair(sa.WORKSPACE, ws),
                SearchAttributePair(sa.STATUS, "validating"),
                SearchAttributePair(sa.ENDPOINT, "/v1/chat/completions"),
                SearchAttributePair(sa.CREATED_AT, created),
            ]
        ),
    )
    b = await poll_until(
        lambda: stack.client().batches.retrieve(batch_id),
        lambda b: b.status != "validating",
        timeout=120,
        what=f"the failing batch {batch_id} to leave 'validating'",
        interval=0.5,
    )
    assert b.status == "failed" and b.failed_at, b
    assert b.errors and [e.code for e in b.errors.data or []] == ["store_error"], b.errors
    desc = await poll_until(
        temporal_client.get_workflow_handle(batch_id).describe,
        lambda d: d.status is not None and d.status.name != "RUNNING",
        timeout=60,
        what=f"the failed batch {batch_id}'s workflow to close",
        interval=0.5,
    )
    assert desc.status is not None and desc.status.name == "COMPLETED", desc.status
    listed = [x async for x in stack.client().batches.list(limit=10)]
    assert [(x.id, x.status) for x in listed if x.id == batch_id] == [(batch_id, "failed")]
