"""What each spare-capacity mode adds next to the live traffic: nothing, a naive client, the
ideal preempting client, or a backfill batch through the real gateway.

The ideal preempting client (`IdealClient`, mode `ideal:K`) is the reference the gateway's
seat-aware admission and preemptive yield are read against: it sits in the live replay's own
process, so it knows the live requests in flight exactly (`InFlight`, shared with the replay),
looks every `IDEAL_REACT_S`, keeps K seats free and, when live traffic needs a seat its requests
hold, closes the youngest of them at once (the simulator aborts a request whose client
disconnects and gives its seat away at the next step) and sends them again later. Its decision is
`ideal_move`, pure.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from api.preemption.push import POLICY_TTL
from bench.spare_workload import Workload, chat_body
from tools.sim import BATCH_HEADER, SimServer

CHAT = "/v1/chat/completions"
IDEAL_REACT_S = 0.005
"""How often the ideal client looks at the live count and its own requests."""
UNAVAILABLE_S = 60.0
"""How long a settings PUT answered 503 (Temporal slow to answer a query on a loaded machine) is
sent again before the run fails."""
SDK_RETRIES = 5
"""The `openai` SDK's retries (with its back-off) of the batch calls: a 503 or a dropped
connection on a loaded machine is not the measurement."""
BATCH_PRIORITY = 10
"""vLLM `priority` the ideal client puts on its requests, as the presets' `priority_hint`."""


class BatchLoad(Protocol):
    """What a mode adds next to live traffic. `start` returns once batch work is running."""

    async def start(self) -> None: ...

    async def stop(self) -> dict[str, Any]: ...


async def wait_for(pred: Callable[[], bool], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {within:.0f}s")
        await asyncio.sleep(0.05)


@dataclass
class InFlight:
    """Live requests the replay has sent and not yet seen end (shared with the ideal client)."""

    n: int = 0


class NoBatch:
    async def start(self) -> None:
        return None

    async def stop(self) -> dict[str, Any]:
        return {}


class NaiveClient:
    """`concurrency` workers, each sending one batch request after another straight to the sim."""

    def __init__(self, sim: SimServer, workload: Workload, concurrency: int) -> None:
        self.sim, self.workload, self.concurrency = sim, workload, concurrency
        self.done = self.failed = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._http = httpx.AsyncClient(
            base_url=sim.url,
            timeout=600,
            limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency),
        )

    async def _worker(self) -> None:
        w = self.workload
        body = chat_body(w.batch_prompt_words, w.batch_output_tokens)
        while True:
            r = await self._http.post(CHAT, json=body, headers={BATCH_HEADER: "naive"})
            if r.status_code == 200:
                self.done += 1
            else:
                self.failed += 1

    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self._worker()) for _ in range(self.concurrency)]
        engine = self.sim.app.engine
        assert engine is not None
        await wait_for(lambda: engine.running > 0, 30, "naive batch requests running")

    async def stop(self) -> dict[str, Any]:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._http.aclose()
        engine = self.sim.app.engine
        assert engine is not None  # the sim notices the disconnects and aborts the requests
        await wait_for(lambda: engine.running + engine.waiting == 0, 30, "naive requests gone")
        return {"batch_requests_finished": self.done, "batch_requests_failed": self.failed}


@dataclass(frozen=True)
class IdealMove:
    """What the ideal client does now: close `cancel` of its youngest requests, or send
    `start` more (never both)."""

    cancel: int = 0
    start: int = 0


def ideal_move(seats: int, keep_free: int, live: int, batch: int) -> IdealMove:
    """Batch requests in flight are held to `seats − keep_free − live` (at least 0): over it, the
    excess is cancelled; under it, the room is filled."""
    room = max(0, seats - keep_free - live)
    if batch > room:
        return IdealMove(cancel=batch - room)
    return IdealMove(start=room - batch)


class IdealClient:
    """The ideal preempting client (module docstring): every batch request is the same, so a
    cancelled one is sent again by the next start."""

    def __init__(self, sim: SimServer, workload: Workload, keep_free: int, live: InFlight):
        self.sim, self.workload, self.keep_free, self.live = sim, workload, keep_free, live
        self.seats = workload.max_num_seqs
        self.done = self.failed = self.cancelled = self.resubmitted = 0
        self._owed = 0
        """Cancelled requests not sent again yet."""
        self._flying: list[asyncio.Task[None]] = []
        """Requests in flight, oldest first."""
        self._control: asyncio.Task[None] | None = None
        self._http = httpx.AsyncClient(
            base_url=sim.url,
            timeout=600,
            limits=httpx.Limits(
                max_connections=4 * self.seats, max_keepalive_connections=self.seats
            ),
        )
        w = workload
        self._body = chat_body(w.batch_prompt_words, w.batch_output_tokens, priority=BATCH_PRIORITY)

    async def _one(self) -> None:
        try:
            r = await self._http.post(CHAT, json=self._body, headers={BATCH_HEADER: "ideal"})
        except httpx.HTTPError:
            self.failed += 1
            return
        if r.status_code == 200:
            self.done += 1
        else:
            self.failed += 1

    def step(self) -> IdealMove:
        """One look: cancel or start as `ideal_move` says."""
        self._flying = [t for t in self._flying if not t.done()]
        move = ideal_move(self.seats, self.keep_free, self.live.n, len(self._flying))
        if move.cancel:
            youngest = self._flying[-move.cancel :]
            del self._flying[-move.cancel :]
            for t in youngest:
                t.cancel()  # httpx closes the connection: the simulator aborts the request
            self.cancelled += move.cancel
            self._owed += move.cancel
        for _ in range(move.start):
            if self._owed:
                self._owed -= 1
                self.resubmitted += 1
            self._flying.append(asyncio.create_task(self._one()))
        return move

    async def _run(self) -> None:
        while True:
            self.step()
            await asyncio.sleep(IDEAL_REACT_S)

    async def start(self) -> None:
        self._control = asyncio.create_task(self._run())
        engine = self.sim.app.engine
        assert engine is not None
        await wait_for(lambda: engine.running > 0, 30, "ideal client's requests running")

    async def stop(self) -> dict[str, Any]:
        tasks = [*self._flying, *([self._control] if self._control else [])]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._http.aclose()
        engine = self.sim.app.engine
        assert engine is not None
        await wait_for(lambda: engine.running + engine.waiting == 0, 30, "ideal requests gone")
        return {
            "batch_requests_finished": self.done,
            "batch_requests_failed": self.failed,
            "batch_requests_cancelled": self.cancelled,
            "batch_requests_resubmitted": self.resubmitted,
        }


def settings_for(settings: dict[str, Any], sim_url: str, seats: int) -> dict[str, Any]:
    """A settings document as PUT for this run: `{sim_url}` anywhere becomes the simulator's URL,
    and seat-aware admission's `seats` the simulator's `max_num_seqs`."""
    out: dict[str, Any] = json.loads(json.dumps(settings).replace("{sim_url}", sim_url))
    if out.get("seat_aware"):
        out["seat_aware"] = {**out["seat_aware"], "seats": seats}
    return out


class BackfillBatch:
    """A batch through the real gateway: route settings PUT, file uploaded, batch created."""

    def __init__(self, stack: Any, workload: Workload, settings: dict[str, Any], lines: int):
        self.stack, self.workload, self.settings, self.lines = stack, workload, settings, lines
        self.batch_id: str | None = None

    async def start(self) -> None:
        from tests.e2e.stack import auth

        stack, w = self.stack, self.workload
        url = f"{stack.api_url}/api/v1/platform/deployments/{stack.route_id}/batch-scheduling"
        settings = settings_for(self.settings, stack.sim.url, w.max_num_seqs)
        async with httpx.AsyncClient(timeout=30) as http:
            deadline = time.monotonic() + UNAVAILABLE_S
            while True:
                r = await http.put(url, json=settings, headers=auth("sk-test-admin"))
                if r.status_code != 503 or time.monotonic() > deadline:
                    break
                await asyncio.sleep(1.0)  # Temporal slow to answer (a loaded machine)
            if r.status_code != 200:
                raise RuntimeError(f"settings refused: {r.status_code} {r.text}")
        put_at = time.monotonic()
        body = chat_body(w.batch_prompt_words, w.batch_output_tokens)
        lines = [
            json.dumps({"custom_id": f"l{i}", "method": "POST", "url": CHAT, "body": body})
            for i in range(self.lines)
        ]
        client = stack.client().with_options(max_retries=SDK_RETRIES)
        f = await client.files.create(
            file=("batch.jsonl", ("\n".join(lines) + "\n").encode()), purpose="batch"
        )
        batch = await client.batches.create(
            input_file_id=f.id, endpoint=CHAT, completion_window="24h"
        )
        self.batch_id = batch.id
        engine = stack.sim.app.engine
        await wait_for(lambda: engine.log.batch.generated_tokens > 0, 120, "batch lines running")
        # An api process reuses a route's preemption policy for POLICY_TTL seconds and nothing
        # says when it has read this mode's: the window starts once that period is over, so no
        # api process still acts on the previous mode's policy.
        await asyncio.sleep(max(0.0, put_at + POLICY_TTL + 1.0 - time.monotonic()))

    async def stop(self) -> dict[str, Any]:
        client = self.stack.client().with_options(max_retries=SDK_RETRIES)
        assert self.batch_id is not None
        batch = await client.batches.cancel(self.batch_id)
        sim_stats = self.stack.sim.app.stats
        await wait_for(lambda: sim_stats.batch.concurrent == 0, 600, "batch lines drained")
        batch = await client.batches.retrieve(self.batch_id)
        counts = batch.request_counts
        return {
            "batch_id": self.batch_id,
            "batch_status": batch.status,
            "batch_lines_completed": counts.completed if counts else None,
        }
