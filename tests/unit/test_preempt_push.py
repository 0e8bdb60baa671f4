"""The api's sender of live counts (preemptive yield's direct channel): a live arrival is reported
to the workers at once, even while the route's policy is being read again from a Temporal that
does not answer (the read has a task of its own)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import httpx

from api.live.traffic import LiveTraffic
from api.preemption.push import PreemptSender
from backfill.routes.gates.preempt import PreemptPolicy

POLICY = PreemptPolicy(batch_seats=6, max_preemptions=3)


class Handle:
    def __init__(self, link: SlowLink) -> None:
        self.link = link

    async def query(self, *_: Any) -> Any:
        self.link.queries += 1
        if self.link.queries > 1:
            await asyncio.Event().wait()  # Temporal stops answering after the first read

        class View:
            preempt = POLICY

        return View()


class SlowLink:
    """The route scheduler's `live_gate` query: answered once, then never again."""

    def __init__(self) -> None:
        self.queries = 0

    def client(self) -> SlowLink:
        return self

    def get_workflow_handle_for(self, *_: Any) -> Handle:
        return Handle(self)


async def test_a_live_arrival_is_sent_while_the_policy_read_hangs(monkeypatch: Any) -> None:
    monkeypatch.setattr("api.preemption.push.POLICY_TTL", 0.0)  # re-read at once, and hang
    reports: list[dict[str, Any]] = []
    got = asyncio.Event()

    async def worker(request: httpx.Request) -> httpx.Response:
        reports.append(json.loads(request.content))
        got.set()
        return httpx.Response(204)

    live = LiveTraffic(["r1"])
    link = SlowLink()
    sender = PreemptSender(
        live,
        link,
        ["r1"],
        ["http://worker"],
        "t",
        "api-1",  # type: ignore[arg-type]
        transport=httpx.MockTransport(worker),
    )
    sender.start()
    try:
        async with asyncio.timeout(5):
            while link.queries < 2 or not reports:  # the first report, and a read now hanging
                await got.wait()
                got.clear()
        with live.in_flight("r1"):
            async with asyncio.timeout(0.5):  # well inside the 1 s keep-alive
                while not any(r["live"] == 1 for r in reports):
                    await got.wait()
                    got.clear()
    finally:
        await sender.stop()
    # Counts only: each worker reads the route's policy from the scheduler itself.
    assert reports[-1]["route"] == "r1" and "policy" not in reports[-1]


async def test_a_worker_that_does_not_answer_holds_no_other_back(monkeypatch: Any) -> None:
    """A found worker that is gone (its sends hang until they time out) must not delay the
    live counts the other workers get: each change reaches the live one at once."""
    got: list[int] = []
    changed = asyncio.Event()

    async def workers(request: httpx.Request) -> httpx.Response:
        if request.url.host == "gone":
            await asyncio.Event().wait()  # never answers (the client's timeout ends it)
        got.append(json.loads(request.content)["live"])
        changed.set()
        return httpx.Response(204)

    live = LiveTraffic(["r1"])
    link = SlowLink()
    sender = PreemptSender(
        live,
        link,
        ["r1"],
        ["http://gone", "http://alive"],
        "t",
        "api-1",  # type: ignore[arg-type]
        transport=httpx.MockTransport(workers),
    )
    sender.start()
    try:
        async with asyncio.timeout(5):
            while not got:  # the policy read, then the first report
                await changed.wait()
                changed.clear()
        with contextlib.ExitStack() as arrivals:
            for n in (1, 2, 3):  # three live arrivals, all well inside the 1 s send timeout
                arrivals.enter_context(live.in_flight("r1"))
                async with asyncio.timeout(0.25):  # each reaches the live worker at once
                    while n not in got:
                        await changed.wait()
                        changed.clear()
    finally:
        await sender.stop()
    assert sender.reached == {"http://alive"}
