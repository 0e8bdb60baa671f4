"""The estimate at submit on the real stack, as the openai SDK's user sees it: the create answer's
`backfill.estimate` read from the route's journaled history (a week of it, written into the
stack's usage journal as the workers write it) and the route's scheduler, kept on later reads,
and the api's count of batches created likely to miss their window."""

from __future__ import annotations

import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from backfill.usage import HOUR, USAGE_DIR, UsageEntry, hour_name
from tests.e2e.stack import Stack, auth, jsonl, wait_terminal

LINES_PER_HOUR = 100
"""The route's journaled batch throughput in every hour of the last week."""
MISSED = "gateway_batches_likely_to_miss_total"


def write_history(stack: Stack, now: float) -> None:
    """A week of the route serving `LINES_PER_HOUR` batch lines an hour, in the stack's usage
    journal (one file per hour, the workers' format; a process name of its own)."""
    usage = stack.tmp / "data" / USAGE_DIR
    usage.mkdir(parents=True, exist_ok=True)
    current = int(now) // HOUR * HOUR
    for hour in range(current - 168 * HOUR, current, HOUR):
        entries = [
            UsageEntry(
                at=hour + i * 30,
                request_id=f"req_history_{hour}_{i}",
                workspace="history",
                key_id=None,
                model="demo",
                route=stack.route_id,
                service_class="batch",
                status="200",
            ).to_line()
            for i in range(LINES_PER_HOUR)
        ]
        path = usage / f"{hour_name(hour)}.e2e-estimate-{stack.suffix}.jsonl"
        path.write_bytes(b"".join(entries))


async def missed(http: httpx.AsyncClient, stack: Stack) -> float:
    resp = await http.get(f"{stack.api_url}/metrics", headers=auth(stack.key("sk-test-auditor")))
    assert resp.status_code == 200, resp.text
    for family in text_string_to_metric_families(resp.text):
        for s in family.samples:
            if s.name == MISSED and s.labels.get("model") == "demo":
                return s.value
    return 0.0


async def test_the_create_answer_says_when_the_batch_should_finish(shared_stack: Stack) -> None:
    stack = shared_stack
    write_history(stack, time.time())
    client = stack.client()
    async with httpx.AsyncClient(timeout=30) as http:
        before = await missed(http, stack)

        # 30 lines at 100 an hour, nothing queued before them: about 18 minutes.
        f = await client.files.create(file=("in.jsonl", jsonl(30)), purpose="batch")
        batch = await client.batches.create(
            input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        assert batch.model_extra is not None
        est = batch.model_extra["backfill"]["estimate"]
        assert est["made_at"] == batch.created_at
        assert est["lines"] == 30 and est["model"] == "demo" and est["lines_ahead"] == 0
        assert est["window_achievable"] is True
        # Other tests' lines served in an earlier hour of this session can only make it sooner.
        assert batch.created_at < est["expected_finish_at"] <= batch.created_at + 18 * 60 + 1
        done = await wait_terminal(client, batch.id)
        assert done.status == "completed"
        assert done.model_extra["backfill"]["estimate"] == est  # kept, never updated

        # 6,000 lines cannot be served in 24 h at 100 an hour: created all the same, flagged,
        # and counted once.
        big = await client.files.create(file=("big.jsonl", jsonl(6000)), purpose="batch")
        late = await client.batches.create(
            input_file_id=big.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        await client.batches.cancel(late.id)
        assert late.model_extra is not None
        est = late.model_extra["backfill"]["estimate"]
        assert est["lines"] == 6000 and est["window_achievable"] is False
        assert est["expected_finish_at"] is None or est["expected_finish_at"] > late.expires_at
        assert await missed(http, stack) == before + 1
