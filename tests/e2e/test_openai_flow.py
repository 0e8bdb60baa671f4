"""The whole path with the official openai SDK: upload, create, watch, download."""

from __future__ import annotations

import json

import pytest
from openai.types import Batch as SDKBatch
from openai.types.chat import ChatCompletion

from tests.e2e.stack import Stack, input_ids, jsonl, watch_until_terminal


async def test_a_batch_completes_exactly_once(shared_stack: Stack) -> None:
    """Progress while it runs, input order, every line once, the cap used and held: none of it
    grows with the batch's size (bench/scale.py measures large batches)."""
    stack = shared_stack
    client = stack.client()
    n = 100
    f = await client.files.create(file=("in.jsonl", jsonl(n)), purpose="batch")
    assert f.purpose == "batch" and f.bytes > 0
    batch = await client.batches.create(
        input_file_id=f.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"job": "e2e"},
    )
    assert batch.status == "validating"
    seen_progress = set()

    def progress(b: SDKBatch) -> None:
        assert isinstance(b, SDKBatch)
        if b.request_counts:
            seen_progress.add(b.request_counts.completed)

    b = await watch_until_terminal(client, batch.id, progress, interval=0.2)
    assert b.status == "completed", b
    assert b.request_counts and b.request_counts.total == n
    assert b.request_counts.completed == n and b.request_counts.failed == 0
    # request_counts moved while it ran, not only at the end
    assert any(0 < c < n for c in seen_progress), seen_progress
    assert b.usage and b.usage.total_tokens > 0
    for field in ("created_at", "in_progress_at", "finalizing_at", "completed_at", "expires_at"):
        assert getattr(b, field), field
    assert b.expires_at == b.created_at + 24 * 3600
    assert b.metadata == {"job": "e2e"}
    assert b.output_file_id
    out = (await client.files.content(b.output_file_id)).text
    ids = []
    for line in out.splitlines():
        rec = json.loads(line)
        ids.append(rec["custom_id"])
        assert rec["response"]["status_code"] == 200
        ChatCompletion.model_validate(rec["response"]["body"])
        assert rec["id"].startswith("batch_req_")
    assert ids == input_ids("req", n)
    assert b.error_file_id is None
    # The upstream saw only this batch's lines (no live traffic, no other batch), every line at
    # least once (a line is re-sent only if its activity was lost), never more at once than the
    # route's cap, and more than one at once (the cap was used, not one line at a time).
    stats = stack.sim.app.stats_dict()
    assert stats["live"]["requests_total"] == 0, stats
    assert stats["batch"]["requests_total"] == stats["requests_total"], stats
    assert set(stats["batch"]["by_batch"]) == {b.id}, stats["batch"]["by_batch"]
    assert stats["batch"]["by_batch"][b.id] >= n, stats["batch"]
    assert 1 < stats["batch"]["peak_concurrent"] <= stack.cap, stats["batch"]


@pytest.mark.store  # also run on the S3 store by `make test` (tests/e2e/stack.py)
async def test_a_responses_batch_gives_sdk_response_records(shared_stack: Stack) -> None:
    """A batch on `/v1/responses` (added through the endpoint registry): lines validated with
    `input`, records that parse as the SDK's `Response`, usage from its `input_tokens` and
    `output_tokens`."""
    from openai.types.responses import Response

    stack = shared_stack
    client = stack.client()
    lines = [
        {
            "custom_id": f"r{i}",
            "method": "POST",
            "url": "/v1/responses",
            "body": {"model": "demo", "input": f"word{i} more", "priority": -100},
        }
        for i in range(3)
    ]
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    f = await client.files.create(file=("in.jsonl", data), purpose="batch")
    batch = await client.batches.create(
        input_file_id=f.id, endpoint="/v1/responses", completion_window="24h"
    )
    b = await watch_until_terminal(client, batch.id, lambda b: None, interval=0.2)
    assert b.status == "completed" and b.request_counts and b.request_counts.completed == 3
    assert b.output_file_id and b.error_file_id is None
    out = (await client.files.content(b.output_file_id)).text
    for i, line in enumerate(out.splitlines()):
        rec = json.loads(line)
        assert rec["custom_id"] == f"r{i}"
        resp = Response.model_validate(rec["response"]["body"])
        assert resp.output_text == f"Simulated word{i} more"
    # 2 input and 3 output tokens a line, read from the Responses API's usage.
    assert b.usage and (b.usage.input_tokens, b.usage.output_tokens) == (6, 9)
    assert b.usage.total_tokens == 15
    seen = [s for s in stack.sim.app.seen if s.path == "/v1/responses"]
    assert len(seen) >= 3 and not any(s.has_priority for s in seen)  # the route has no hint
