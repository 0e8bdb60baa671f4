"""Line order for the prefix cache on the real stack: a batch whose lines alternate between two
long system prompts reaches the model server one prompt's lines after the other's, and its
output is still in input order, every line once. When each line was served is read from the
usage journal the worker writes (by the request id its output record carries)."""

from __future__ import annotations

import json

from backfill.usage.journal import read_entries
from tests.e2e.stack import Stack, output_ids, wait_terminal
from tests.polling import poll_until

SYSTEM = {
    "A": "You are a careful translator of legal texts. " * 12,  # ~550 bytes: two levels
    "B": "You summarise scientific papers in one line. " * 12,
}
N = 24


def interleaved() -> bytes:
    lines = []
    for i in range(N):
        kind = "AB"[i % 2]
        body = {
            "model": "demo",
            "messages": [
                {"role": "system", "content": SYSTEM[kind]},
                {"role": "user", "content": f"item {i}"},
            ],
        }
        lines.append({"custom_id": f"{kind}-{i}", "method": "POST", "url": "/v1/chat/completions"})
        lines[-1]["body"] = body
    return ("\n".join(json.dumps(line) for line in lines) + "\n").encode()


def switches(kinds: list[str]) -> int:
    return sum(a != b for a, b in zip(kinds, kinds[1:], strict=False))


async def test_lines_sharing_a_system_prompt_reach_the_server_together(
    shared_stack: Stack,
) -> None:
    stack = shared_stack
    client = stack.client()
    f = await client.files.create(file=("in.jsonl", interleaved()), purpose="batch")
    batch = await client.batches.create(
        input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    done = await wait_terminal(client, batch.id)
    assert done.status == "completed", done
    ids, errors = await output_ids(client, done)
    order_in_file = [f"{'AB'[i % 2]}-{i}" for i in range(N)]
    assert ids == order_in_file and errors == []  # input order, each line once
    assert switches([c[0] for c in order_in_file]) == N - 1

    out = (await client.files.content(done.output_file_id)).text
    by_request = {
        json.loads(line)["response"]["request_id"]: json.loads(line)["custom_id"]
        for line in out.splitlines()
    }

    def served() -> list[str]:
        entries = [
            e
            for e in read_entries(stack.tmp / "data")
            if e.batch_id == batch.id and e.request_id in by_request
        ]
        return [by_request[e.request_id] for e in sorted(entries, key=lambda e: e.at)]

    # The journal is flushed within a second or so of each attempt.
    order_served = await poll_until(
        served, lambda s: len(s) == N, timeout=30, what="every line's usage entry"
    )
    # One prompt's lines, then the other's: at most a few swaps where the groups meet (the
    # route runs 4 lines at once, so the last of one group and the first of the next overlap).
    assert switches([c[0] for c in order_served]) <= 3, order_served
