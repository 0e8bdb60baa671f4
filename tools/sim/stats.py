"""The simulator's live state besides the engine: the fixed-latency mode's scheduler (seats and a
waiting heap) and what the inference endpoints saw (`SimStats`, `SeenRequest`), read by
`/sim/stats`, `/metrics` and the tests."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

ABORTED, DROPPED = -1, 0
"""Pseudo statuses for the stats: the client left before the answer; the connection dropped."""

if TYPE_CHECKING:
    from tools.sim.gpu import GpuEngine
    from tools.sim.requests import SimRequest


class Scheduler:
    """At most ``max_num_seqs`` running; the rest wait in a heap of (priority, arrival)."""

    def __init__(self, max_num_seqs: int, use_priority: bool) -> None:
        self.max_num_seqs, self.use_priority = max_num_seqs, use_priority
        self.running = self.waiting = self.peak_running = self.peak_waiting = 0
        self._heap: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def try_acquire(self) -> bool:
        if self.running >= self.max_num_seqs or self.waiting:
            return False
        self.running += 1
        self.peak_running = max(self.peak_running, self.running)
        return True

    async def acquire(self, priority: int = 0) -> None:
        if self.try_acquire():
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._heap, (priority if self.use_priority else 0, next(self._seq), fut))
        self.waiting += 1
        self.peak_waiting = max(self.peak_waiting, self.waiting)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.cancelled():  # still queued: its heap entry is skipped lazily
                self.waiting -= 1
            else:  # granted a slot in the same tick as the cancellation
                self.release()
            raise

    def release(self) -> None:
        self.running -= 1
        while self._heap and self.running < self.max_num_seqs:
            fut = heapq.heappop(self._heap)[2]
            if fut.done():
                continue
            self.waiting -= 1
            self.running += 1
            self.peak_running = max(self.peak_running, self.running)
            fut.set_result(None)


@dataclass(slots=True)
class Traffic:
    requests_total: int = 0
    concurrent: int = 0
    peak_concurrent: int = 0
    prompt_tokens: int = 0
    """Tokens of the answers completed (usage sent or, for a stream, its last event sent)."""
    completion_tokens: int = 0

    def begin(self) -> None:
        self.requests_total += 1
        self.concurrent += 1
        self.peak_concurrent = max(self.peak_concurrent, self.concurrent)

    def reset(self) -> None:
        self.requests_total, self.peak_concurrent = 0, self.concurrent
        self.prompt_tokens = self.completion_tokens = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests_total": self.requests_total,
            "concurrent": self.concurrent,
            "peak_concurrent": self.peak_concurrent,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
        }


@dataclass(frozen=True, slots=True)
class SeenRequest:
    """What the simulator saw of one inference request (test hook: `SimApp.seen`)."""

    path: str
    request_id: str | None
    batch: str | None
    authorization: str | None
    has_priority: bool
    """Whether the body carried a `priority` field at all."""
    at: float = 0.0
    """Arrival, `time.monotonic()` seconds."""
    priority: object = None
    """The body's `priority` value, if any."""


@dataclass
class SimStats:
    """HTTP-level traffic of the inference endpoints (arrival until the response is sent)."""

    all: Traffic = field(default_factory=Traffic)
    batch: Traffic = field(default_factory=Traffic)
    live: Traffic = field(default_factory=Traffic)
    by_status: Counter[int] = field(default_factory=Counter)
    by_batch: Counter[str] = field(default_factory=Counter)
    priorities: Counter[int] = field(default_factory=Counter)
    # monotonic, for /metrics (never reset)
    success_by_reason: Counter[str] = field(default_factory=Counter)
    prompt_tokens: int = 0
    generation_tokens: int = 0

    def begin(self, batch: bytes | None) -> None:
        self.all.begin()
        if batch is None:
            self.live.begin()
        else:
            self.batch.begin()
            self.by_batch[batch.decode("latin-1")] += 1

    def end(self, batch: bytes | None, status: int) -> None:
        self.all.concurrent -= 1
        (self.live if batch is None else self.batch).concurrent -= 1
        self.by_status[status] += 1

    def served(self, req: SimRequest, usage: dict[str, int]) -> None:
        """Count a completed answer's tokens under its traffic class."""
        traffic = self.batch if req.batch else self.live
        traffic.prompt_tokens += usage.get("prompt_tokens", 0)
        traffic.completion_tokens += usage.get("completion_tokens", 0)

    def reset(self, sched: Scheduler | GpuEngine) -> None:
        for t in (self.all, self.batch, self.live):
            t.reset()
        self.by_status.clear()
        self.by_batch.clear()
        self.priorities.clear()
        sched.peak_running, sched.peak_waiting = sched.running, sched.waiting
