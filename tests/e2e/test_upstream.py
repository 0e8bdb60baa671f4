"""What the upstream does to lines, on the real stack with the simulator's fault injection:
429/503 requeue with back-off, the retry budget ending in the error file, connection refused,
the route's api key header, the completions and embeddings endpoints, and a route removed from
the config while its lines wait."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from openai.types import Completion, CreateEmbeddingResponse
from temporalio.client import Client

from tests.e2e.conftest import MakeStack
from tests.e2e.stack import (
    Stack,
    assert_input_order,
    auth,
    input_ids,
    jsonl,
    output_ids,
    submit,
    wait_terminal,
)
from tests.polling import poll_until
from tests.workflows.events import E, completed_result, find
from tools.sim import SimConfig

RETRIES = 2  # the stack's [limits] max_line_retries: each line is sent at most 1 + 2 times


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def faulty(tmp_path_factory: pytest.TempPathFactory, dev_server: Any) -> AsyncIterator[Stack]:
    s = Stack(
        tmp_path_factory.mktemp("upstream"),
        dev_server.address,
        cap=2,
        sim=SimConfig(model_names=[], latency_ms=20),
        limits={"max_line_retries": RETRIES},
    )
    async with s.running():
        yield s


async def set_faults(stack: Stack, *faults: dict[str, Any]) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        assert (await http.delete(f"{stack.sim.url}/sim/faults")).status_code == 200
        if faults:
            r = await http.post(f"{stack.sim.url}/sim/faults", json=list(faults))
            assert r.status_code == 200, r.text


def sent(stack: Stack, batch_id: str) -> int:
    return int(stack.sim.app.stats_dict()["batch"]["by_batch"].get(batch_id, 0))


async def test_429_and_503_are_requeued_backed_off_and_sent_again(
    faulty: Stack, temporal_client: Client
) -> None:
    stack = faulty
    await set_faults(
        stack, {"status": 429, "count": 2, "retry_after": 0}, {"status": 503, "count": 1}
    )
    try:
        batch_id = await submit(stack, 4, prefix="busy")
        b = await wait_terminal(stack.client(), batch_id, within=180)
    finally:
        await set_faults(stack)
    assert b.status == "completed" and b.request_counts.completed == 4, b
    ids, errors = await output_ids(stack.client(), b)
    assert ids == input_ids("busy", 4) and errors == []
    assert sent(stack, batch_id) == 4 + 3  # the three refused tries were sent again
    # The route backed off: after a line came back 'retry', the batch set a timer before the
    # next line started.
    history = await temporal_client.get_workflow_handle(batch_id).fetch_history()
    retried = find(
        history,
        E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED,
        lambda e: (completed_result(e) or {}).get("retry") is True,
    )
    assert retried >= 0, "no line came back 'retry'"
    later = [e.event_type for e in history.events[retried:]]
    assert E.EVENT_TYPE_TIMER_STARTED in later, "no back-off timer after the retry"


async def test_retry_budget_ends_in_the_error_file(faulty: Stack) -> None:
    stack = faulty
    await set_faults(stack, {"status": 503, "message": "overloaded"})  # until cleared
    try:
        batch_id = await submit(stack, 3, prefix="budget")
        b = await wait_terminal(stack.client(), batch_id, within=180)
    finally:
        await set_faults(stack)
    assert b.status == "completed", b
    assert b.request_counts.completed == 0 and b.request_counts.failed == 3, b
    ids, errors = await output_ids(stack.client(), b)
    assert ids == []
    assert [e["custom_id"] for e in errors] == input_ids("budget", 3)
    for e in errors:  # the last answer is kept, as the upstream gave it
        assert e["response"]["status_code"] == 503, e
        assert e["response"]["body"]["error"]["message"] == "overloaded", e
    assert sent(stack, batch_id) == 3 * (1 + RETRIES)


async def test_connection_refused_ends_in_the_error_file(faulty: Stack) -> None:
    stack = faulty
    await stack.sim.stop()  # nothing listens on the route's port
    try:
        batch_id = await submit(stack, 2, prefix="refused")
        b = await wait_terminal(stack.client(), batch_id, within=180)
    finally:
        await stack.sim.start()
    assert b.status == "completed" and b.request_counts.failed == 2, b
    ids, errors = await output_ids(stack.client(), b)
    assert ids == [] and [e["custom_id"] for e in errors] == input_ids("refused", 2)
    for e in errors:
        assert e["response"] is None and e["error"]["code"] == "connection_error", e


async def test_completions_and_embeddings_endpoints(shared_stack: Stack) -> None:
    client = shared_stack.client()
    for endpoint, model in (
        ("/v1/completions", Completion),
        ("/v1/embeddings", CreateEmbeddingResponse),
    ):
        f = await client.files.create(
            file=("in.jsonl", jsonl(3, prefix="ep", endpoint=endpoint)), purpose="batch"
        )
        b = await client.batches.create(
            input_file_id=f.id,
            endpoint=endpoint,  # type: ignore[arg-type]
            completion_window="24h",
        )
        b = await wait_terminal(client, b.id, within=120)
        assert b.status == "completed" and b.endpoint == endpoint, b
        assert b.request_counts and b.request_counts.completed == 3, b
        assert b.output_file_id
        text = (await client.files.content(b.output_file_id)).text
        records = [json.loads(line) for line in text.splitlines()]
        assert [r["custom_id"] for r in records] == input_ids("ep", 3)
        for r in records:
            assert r["response"]["status_code"] == 200
            model.model_validate(r["response"]["body"])


async def test_api_key_env_header_reaches_the_upstream(make_stack: MakeStack) -> None:
    """The route's `api_key_env` names an environment variable of the worker; its value goes
    upstream as `Authorization: Bearer ...`. The simulator answers 401 without it."""
    secret = "sk-upstream-" + "x" * 8
    s = await make_stack(
        sim=SimConfig(model_names=[], latency_ms=5, api_key=secret),
        route_extra={"api_key_env": "BACKFILL_TEST_UPSTREAM_KEY"},
        extra_env={"BACKFILL_TEST_UPSTREAM_KEY": secret},
    )
    batch_id = await submit(s, 3, prefix="key")
    b = await wait_terminal(s.client(), batch_id, within=120)
    assert b.status == "completed" and b.request_counts.completed == 3, b
    stats = s.sim.app.stats_dict()
    assert stats["responses_by_status"] == {"200": 3}, stats


async def test_route_removed_while_its_lines_wait(tmp_path: Path, dev_server: Any) -> None:
    """A batch paused with lines on two routes; the worker restarts with a config without one
    of them. On resume, that route's waiting lines end as `route_removed`; the rest complete."""
    s = Stack(tmp_path, dev_server.address, cap=1, extra_routes=1)
    async with s.running():
        kept, removed = s.routes
        batch_id = await submit(s, 20, prefix="rr")
        async with httpx.AsyncClient(timeout=60) as http:
            r = await http.post(f"{s.api_url}/v1/batches/{batch_id}/pause", headers=auth())
            assert r.status_code == 200, r.text

            async def routes() -> dict[str, dict[str, Any]]:
                b = (await http.get(f"{s.api_url}/v1/batches/{batch_id}", headers=auth())).json()
                return {r["route"]: r for r in b["backfill"]["routes"]}

            before = await poll_until(
                routes,
                lambda rs: len(rs) == 2 and all(r["running_lines"] == 0 for r in rs.values()),
                timeout=60,
                what="the paused batch validated and drained",
            )
            waiting = before[removed]["total_lines"] - before[removed]["finished_lines"]
            assert waiting > 0, before
            for w in s.workers:
                await asyncio.to_thread(w.stop)
            s.routes = [kept]
            s.write_config()
            s.start_worker()
            r = await http.post(f"{s.api_url}/v1/batches/{batch_id}/resume", headers=auth())
            assert r.status_code == 200, r.text
        b = await wait_terminal(s.client(), batch_id, within=120)
        assert b.status == "completed", b
        ids, errors = await output_ids(s.client(), b)
        assert {e["error"]["code"] for e in errors} == {"route_removed"}, errors
        assert len(errors) == waiting and len(ids) + len(errors) == 20
        assert_input_order(ids, input_ids("rr", 20))
        assert_input_order([e["custom_id"] for e in errors], input_ids("rr", 20))
