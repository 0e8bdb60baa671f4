"""A live answer between its two ends: the model server's side is done when the model server has
sent the answer, the client's when the client has read it.

The proxy reads the upstream into a `RelayBuffer` in one task and writes it to the client from
another, so a client that reads slowly (or not at all) does not keep the upstream request open,
nor the route's live count up, once the answer has arrived. What one answer holds ahead of its
client is bounded (`limits.live_buffer_bytes`), and so is what every answer of the process holds
together (`RelayBudget`, `limits.live_buffer_total_bytes`); past either, the upstream is read only
as the client reads. The one chunk in hand is always let in (httpx reads at most 64 KiB at a time),
so an answer moves whatever the budget: the process holds at most the budget plus 64 KiB per
live answer. A client that reads nothing for `limits.live_stall_seconds` is cut (`api.live.proxy`).
"""

from __future__ import annotations

import asyncio
from collections import deque

from httpcore._async.http11 import AsyncHTTP11Connection
from prometheus_client import Counter

CLIENTS_CUT = Counter(
    "gateway_live_clients_cut_total",
    "Live clients cut for taking nothing of their answer for limits.live_stall_seconds.",
    ["route"],
)


UNCHARGED_CHUNK_BYTES = AsyncHTTP11Connection.READ_NUM_BYTES
"""The most an empty buffer takes past the budget: one chunk as the upstream connection reads it
(httpcore reads at most 64 KiB at a time), so a process holds at most its budget plus this much
per live request."""


class RelayBudget:
    """Bytes held by every `RelayBuffer` of the process, at most `total`. One per app."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.used = 0
        """Bytes charged now."""
        self._waiting: set[asyncio.Event] = set()

    def try_take(self, n: int) -> bool:
        if self.used + n > self.total:
            return False
        self.used += n
        return True

    def give_back(self, n: int) -> None:
        self.used -= n
        for room in self._waiting:  # every buffer waiting for room tries again
            room.set()


class RelayBuffer:
    """One answer's chunks on their way from the upstream (`put`, `end`) to the client (`get`)."""

    def __init__(self, limit: int, budget: RelayBudget) -> None:
        self.limit, self.budget = limit, budget
        self._chunks: deque[tuple[bytes, int]] = deque()
        """Each chunk with the bytes of it charged to the budget (0: let in uncharged)."""
        self.size = 0
        """Bytes held now."""
        self.ended = False
        self.complete = False
        """Ended with the whole answer (not broken off)."""
        self._room = asyncio.Event()
        self._data = asyncio.Event()

    async def put(self, chunk: bytes) -> None:
        """Hold `chunk` for the client, waiting while this answer or the process is at its
        bound (an empty buffer always takes one chunk)."""
        while True:
            if self.size + len(chunk) <= self.limit and self.budget.try_take(len(chunk)):
                charged = len(chunk)
                break
            if self.size == 0:
                charged = 0
                break
            self._room.clear()
            self.budget._waiting.add(self._room)
            try:
                await self._room.wait()
            finally:
                self.budget._waiting.discard(self._room)
        self._chunks.append((chunk, charged))
        self.size += len(chunk)
        self._data.set()

    def end(self, *, complete: bool) -> None:
        """No more chunks: the answer is whole (`complete`) or broke off."""
        self.ended, self.complete = True, complete
        self._data.set()

    async def get(self) -> bytes | None:
        """The next chunk, or None once the buffer has ended and is empty."""
        while not self._chunks:
            if self.ended:
                return None
            self._data.clear()
            await self._data.wait()
        chunk, charged = self._chunks.popleft()
        self.size -= len(chunk)
        if charged:
            self.budget.give_back(charged)
        self._room.set()
        return chunk

    def close(self) -> None:
        """Drop what is held (the client is gone), giving its bytes back to the budget."""
        while self._chunks:
            _, charged = self._chunks.popleft()
            if charged:
                self.budget.give_back(charged)
        self.size = 0
        self._room.set()
