"""The estimate at submit on the real stack, as the openai SDK's user sees it: the create answer's
`backfill.estimate` read from the route's journaled history (a week of it, written into the
stack's usage journal as the workers write it, or the lines the route served this hour) and the
route's scheduler, kept on later reads, and the api's count of batches created likely to miss
their window. Each test has a stack of its own: lines another test served this hour would be
part of the route's pace."""

from __future__ import annotations

import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from backfill.usage.journal import HOUR, USAGE_DIR, UsageEntry, hour_name
from tests.e2e.conftest import MakeStack
from tests.e2e.stack import Stack, auth, jsonl, wait_terminal
from tests.polling import poll_until

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


def served_lines(stack: Stack) -> int:
    """Batch lines the stack's route answered 200, as journaled so far."""
    served = 0
    for path in (stack.tmp / "data" / USAGE_DIR).glob("*.jsonl"):
        for line in path.read_bytes().splitlines():
            try:
                e = UsageEntry.from_line(line)
            except (ValueError, TypeError):
                continue  # a line being written
            served += e.route == stack.route_id and e.service_class == "batch" and e.status == "200"
    return served


async def test_a_fresh_route_has_an_estimate_once_it_has_served_lines(
    make_stack: MakeStack,
) -> None:
    """A route that never served a batch: its first batch has no estimate (unknown, not a likely
    miss); once that batch's lines were served, the next batch is estimated from their pace,
    though no hour of the route's history has ended."""
    stack = await make_stack()
    client = stack.client()
    async with httpx.AsyncClient(timeout=30) as http:
        f = await client.files.create(file=("in.jsonl", jsonl(20)), purpose="batch")
        first = await client.batches.create(
            input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        assert first.model_extra is not None
        est = first.model_extra["backfill"]["estimate"]
        assert (est["expected_finish_at"], est["window_achievable"]) == (None, None)
        assert await missed(http, stack) == 0
        assert (await wait_terminal(client, first.id)).status == "completed"
        await poll_until(
            lambda: served_lines(stack),
            lambda n: n >= 20,
            timeout=60,
            what="the first batch's 20 lines in the usage journal",
        )

        second = await client.batches.create(
            input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        assert second.model_extra is not None
        est = second.model_extra["backfill"]["estimate"]
        assert est["window_achievable"] is True
        # 20 lines at the pace of 20 lines in at most two minutes: within 2 minutes.
        assert second.created_at <= est["expected_finish_at"] <= second.created_at + 120
        assert (await wait_terminal(client, second.id)).status == "completed"
        assert await missed(http, stack) == 0


async def test_the_create_answer_says_when_the_batch_should_finish(make_stack: MakeStack) -> None:
    stack = await make_stack()
    write_history(stack, time.time())
    client = stack.client()
    async with httpx.AsyncClient(timeout=30) as http:
        before = await missed(http, stack)

        # 30 lines at 100 an hour in 50 busy minutes (120 an hour), nothing queued before
        # them: 15 minutes.
        f = await client.files.create(file=("in.jsonl", jsonl(30)), purpose="batch")
        batch = await client.batches.create(
            input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        assert batch.model_extra is not None
        est = batch.model_extra["backfill"]["estimate"]
        assert est["made_at"] == batch.created_at
        assert est["lines"] == 30 and est["model"] == "demo" and est["lines_ahead"] == 0
        assert est["window_achievable"] is True
        assert batch.created_at < est["expected_finish_at"] <= batch.created_at + 15 * 60 + 1
        done = await wait_terminal(client, batch.id)
        assert done.status == "completed"
        assert done.model_extra["backfill"]["estimate"] == est  # kept, never updated

        # 6,000 lines cannot be served in 24 h at 120 an hour (nor at the pace of the 30 lines
        # served this hour, at most 30 a minute, for what is left of it): created all the same,
        # flagged, and counted once.
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
