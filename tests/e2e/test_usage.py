"""Usage accounting on the real stack: after live and batch traffic, the usage journal's totals
(the admin API, and the api's and worker's Prometheus counters) equal the tokens the simulator
says it served, per service class; a cancelled batch's lines that never ran count nothing."""

from __future__ import annotations

from typing import Any

import httpx

from backfill.usage.journal import read_entries
from tests.e2e.conftest import MakeStack
from tests.e2e.stack import Stack, auth, jsonl, submit, wait_terminal
from tests.e2e.test_metrics import scrape, value, worker_url
from tests.polling import poll_until
from tools.sim import SimConfig

ALPHA, ADMIN, AUDITOR = "sk-test-alpha", "sk-test-admin", "sk-test-auditor"
CANCELLED_LINES = 30


async def live_traffic(stack: Stack) -> None:
    client = stack.client(ALPHA)
    for i in range(3):
        await client.chat.completions.create(
            model="demo", messages=[{"role": "user", "content": f"live question {i} " * (i + 1)}]
        )
    await client.completions.create(model="demo", prompt="a live prompt", max_tokens=4)
    stream = await client.chat.completions.create(
        model="demo",
        messages=[{"role": "user", "content": "stream me some words"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    async for _ in stream:
        pass


async def cancelled_batch(stack: Stack, http: httpx.AsyncClient) -> str:
    """A batch cancelled after a couple of its lines ran, most never sent."""
    client = stack.client(ALPHA)
    f = await client.files.create(
        file=("slow.jsonl", jsonl(CANCELLED_LINES, prefix="cx")), purpose="batch"
    )
    batch = await client.batches.create(
        input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    await poll_until(
        lambda: http.get(f"{stack.sim.base_url.removesuffix('/v1')}/sim/stats"),
        lambda r: r.json()["batch"]["by_batch"].get(batch.id, 0) >= 2,
        timeout=120,
        what="two lines of the batch to reach the upstream",
    )
    await client.batches.cancel(batch.id)
    done = await wait_terminal(client, batch.id, within=120)
    assert done.status == "cancelled"
    return batch.id


async def test_usage_totals_equal_the_tokens_the_upstream_served(make_stack: MakeStack) -> None:
    stack = await make_stack(cap=1, sim=SimConfig(model_names=[], latency_ms=150))
    ws = stack.workspaces["alpha"]
    sim_url = stack.sim.base_url.removesuffix("/v1")
    async with httpx.AsyncClient(timeout=60) as http:
        await live_traffic(stack)
        done = await wait_terminal(stack.client(ALPHA), await submit(stack, 4, key=ALPHA), 120)
        assert done.status == "completed"
        cancelled = await cancelled_batch(stack, http)
        await live_traffic(stack)  # live traffic after the batches too

        served = (await http.get(f"{sim_url}/sim/stats")).json()
        assert served["live"]["completion_tokens"] > 0 and served["batch"]["completion_tokens"] > 0
        want = {
            cls: (served[cls]["prompt_tokens"], served[cls]["completion_tokens"])
            for cls in ("batch", "live")
        }

        async def totals(key: str = AUDITOR, **params: Any) -> dict[str, tuple[int, int]]:
            r = await http.get(
                f"{stack.api_url}/api/v1/admin/usage",
                headers=auth(key),
                params={"workspace": ws, **params},
            )
            assert r.status_code == 200, r.text
            sums: dict[str, tuple[int, int]] = {}
            for row in r.json()["data"]:
                assert row["workspace"] == ws and row["model"] == "demo"
                p, c = sums.get(row["service_class"], (0, 0))
                sums[row["service_class"]] = (
                    p + row["prompt_tokens"],
                    c + row["completion_tokens"],
                )
            return sums

        # Journals are flushed within a second of each attempt: wait for them, then compare.
        await poll_until(
            totals, lambda got: got == want, timeout=30, what="usage totals to equal the sim's"
        )
        assert await totals(ADMIN) == want
        assert await totals(AUDITOR, **{"from": 0, "to": 1}) == {}
        for bad in ({"from": "yesterday"}, {"from": 10, "to": 5}):
            r = await http.get(
                f"{stack.api_url}/api/v1/admin/usage", headers=auth(AUDITOR), params=bad
            )
            assert r.status_code == 400 and set(r.json()["error"]) == {
                "message",
                "type",
                "param",
                "code",
            }, r.text
        member = await http.get(f"{stack.api_url}/api/v1/admin/usage", headers=auth(ALPHA))
        assert member.status_code == 403, member.text
        assert member.json()["error"]["code"] == "insufficient_role"

        # The cancelled batch: one entry per line that ran (each with its own request id),
        # none for the lines that never did.
        entries = [e for e in read_entries(stack.tmp / "data") if e.batch_id == cancelled]
        retrieved = await stack.client(ALPHA).batches.retrieve(cancelled)
        assert retrieved.request_counts is not None
        ran = (await http.get(f"{sim_url}/sim/stats")).json()["batch"]["by_batch"][cancelled]
        assert ran < CANCELLED_LINES
        assert len(entries) <= ran
        assert sum(e.status == "200" for e in entries) == retrieved.request_counts.completed
        assert len({e.request_id for e in entries}) == len(entries)
        assert all(e.request_id.startswith("req_") for e in entries)

        # Each process exports what it served: live on the api, batch on the worker.
        api = await scrape(http, f"{stack.api_url}/metrics")
        worker = await scrape(http, worker_url(stack))
        for samples, cls in ((api, "live"), (worker, "batch")):
            got = tuple(
                value(
                    samples,
                    "gateway_usage_tokens_total",
                    workspace=ws,
                    model="demo",
                    service_class=cls,
                    kind=kind,
                )
                or 0
                for kind in ("prompt", "completion")
            )
            assert got == want[cls], cls
        assert (
            value(
                api,
                "gateway_usage_requests_total",
                workspace=ws,
                model="demo",
                service_class="live",
            )
            == served["live"]["requests_total"]
        )
