"""Without a worker running, the api still answers from what Temporal records: a batch's
retrieve and a route's settings are 200 (marked stale) within seconds, and a cancel never
hangs past its bound."""

from __future__ import annotations

import time

import httpx

from tests.e2e.conftest import MakeStack
from tests.e2e.stack import auth, submit
from tests.polling import poll_until
from tools.sim import SimConfig

ADMIN = "sk-test-admin"
ANSWER_WITHIN = 6.0
"""The quick query's bound (2.5 s in all: api.batches.history_view.quick_query) plus the history
read, with room for a loaded machine."""
CANCEL_BOUND = 15.0
"""The api's bound on a whole Temporal call (10 s) plus the quick query's fallback."""


async def test_retrieve_and_settings_answer_without_a_worker(make_stack: MakeStack) -> None:
    stack = await make_stack(cap=2, sim=SimConfig(model_names=[], latency_ms=400))
    settings_url = f"{stack.api_url}/api/v1/platform/deployments/{stack.route_id}/batch-scheduling"
    batch_id = await submit(stack, 30)
    async with httpx.AsyncClient(timeout=60) as http:
        r = await http.put(settings_url, headers=auth(ADMIN), json={"max_concurrent_lines": 1})
        assert r.status_code == 200, r.text

        async def fetch() -> dict:  # type: ignore[type-arg]
            r = await http.get(f"{stack.api_url}/v1/batches/{batch_id}", headers=auth())
            assert r.status_code == 200, r.text
            return r.json()  # type: ignore[no-any-return]

        live = await poll_until(
            fetch,
            lambda b: b["status"] == "in_progress" and b["request_counts"]["completed"] >= 1,
            timeout=120,
            what="the batch to run",
        )
        assert live["backfill"]["stale"] is False

        stack.workers[0].kill()

        started = time.monotonic()
        r = await http.get(f"{stack.api_url}/v1/batches/{batch_id}", headers=auth())
        took = time.monotonic() - started
        assert r.status_code == 200, r.text
        assert took < ANSWER_WITHIN, took
        got = r.json()
        assert got["id"] == batch_id and got["status"] == "in_progress"
        assert got["input_file_id"] == live["input_file_id"]
        assert got["completion_window"] == "24h" and got["created_at"] == live["created_at"]
        assert got["backfill"]["stale"] is True
        # From the status memo written when the batch went in_progress.
        assert got["request_counts"]["total"] == 30
        assert got["in_progress_at"] == live["in_progress_at"]

        r = await http.get(f"{stack.api_url}/v1/batches", headers=auth())
        assert r.status_code == 200, r.text
        [listed] = [b for b in r.json()["data"] if b["id"] == batch_id]
        assert listed["backfill"]["stale"] is True and listed["request_counts"]["total"] == 30

        started = time.monotonic()
        r = await http.get(settings_url, headers=auth(ADMIN))
        took = time.monotonic() - started
        assert r.status_code == 200, r.text
        assert took < ANSWER_WITHIN, took
        doc = r.json()
        assert doc["settings"]["max_concurrent_lines"] == 1, doc
        assert doc["status"]["stale"] is True

        started = time.monotonic()
        r = await http.post(f"{stack.api_url}/v1/batches/{batch_id}/pause", headers=auth())
        took = time.monotonic() - started
        assert r.status_code == 200, r.text
        assert took < ANSWER_WITHIN, took
        assert r.json()["backfill"]["paused"] is True and r.json()["backfill"]["stale"] is True

        started = time.monotonic()
        r = await http.post(f"{stack.api_url}/v1/batches/{batch_id}/cancel", headers=auth())
        took = time.monotonic() - started
        assert r.status_code in (200, 503), r.text
        assert took < CANCEL_BOUND, took
        if r.status_code == 503:
            assert r.json()["error"]["code"] == "temporal_unavailable", r.text

        # Back with a worker, the batch answers for itself again.
        stack.start_worker()
        fresh = await poll_until(
            fetch, lambda b: not b["backfill"]["stale"], timeout=60, what="a live answer"
        )
        assert fresh["status"] in ("in_progress", "cancelling", "cancelled")
        if fresh["status"] == "in_progress":  # the cancel did not get through: the pause did
            assert fresh["backfill"]["paused"] is True, fresh
