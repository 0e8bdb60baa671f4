"""A process's byte budget for one kind of buffer a request fills, shared by every tenant.

A shared process (the api, a worker) holds buffers whose size a client chooses: request bodies,
a live answer kept to read its usage, a batch line's answer kept to be recorded. A cap per
request does not bound the process (many requests, many tenants), so each such buffer also
draws on its process's `ByteBudget`: at most `total` bytes at once for everyone, and at most
`share` for any one tenant (a workspace), so one tenant filling its share leaves the rest to
the others. What a refused buffer does instead is its user's choice, and never loses a
client's data: the api passes a live answer on without reading its usage, or answers 503 to a
body it cannot take; a worker puts the line back in its queue (docs/operator-guide.md, "Memory
budget per process").

Thread-safe: the worker's store threads and its event loop may both hold claims.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from types import TracebackType

from backfill.platform import metrics

API_BASELINE_BYTES = 192 * 1024 * 1024
"""What an api process holds besides the buffers requests fill (the interpreter, libraries, the
Temporal client, caches): it idles at about 85 MiB and stayed under 92 MiB through 200,000-line
batches (docs/performance.md); twice that is allowed. Used by the memory budget
(docs/operator-guide.md)."""
WORKER_BASELINE_BYTES = 384 * 1024 * 1024
"""The same for a worker, whose cached workflow runs grow with their history: 82 MiB idle,
207 MiB at most in the runs of docs/performance.md (about 5 KB per history event of a run)."""


@dataclass
class ByteBudget:
    total: int
    """Bytes all claims may hold together."""
    share: int
    """Bytes the claims of one tenant may hold together (at most `total`)."""
    name: str = ""
    """The `buffer` label of its metrics (`gateway_buffer_bytes`, `gateway_buffer_refusals_total`);
    empty: none."""
    held: int = 0
    """Bytes held now, by every claim."""
    refusals: int = 0
    """Growths refused so far (for a metric and tests)."""
    _by_tenant: dict[str, int] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if self.total < 0 or self.share < 0:
            raise ValueError("a byte budget is not negative")
        self.share = min(self.share, self.total)

    def claim(self, tenant: str) -> Claim:
        """A claim of `tenant`, holding nothing yet; release it when its buffer is gone."""
        return Claim(self, tenant)

    def held_by(self, tenant: str) -> int:
        with self._lock:
            return self._by_tenant.get(tenant, 0)

    def _resize(self, tenant: str, now: int, size: int) -> bool:
        grow = size - now
        with self._lock:
            mine = self._by_tenant.get(tenant, 0)
            if grow > 0 and (self.held + grow > self.total or mine + grow > self.share):
                self.refusals += 1
                if self.name:
                    metrics.BUFFER_REFUSALS.labels(self.name).inc()
                return False
            self.held += grow
            if mine + grow:
                self._by_tenant[tenant] = mine + grow
            else:
                self._by_tenant.pop(tenant, None)
            if self.name:
                metrics.BUFFER_BYTES.labels(self.name).set(self.held)
            return True


class Claim:
    """The bytes one buffer holds of a `ByteBudget`, under one tenant."""

    def __init__(self, budget: ByteBudget, tenant: str) -> None:
        self.budget = budget
        self.tenant = tenant
        self.size = 0
        """Bytes this claim holds."""

    def resize(self, size: int) -> bool:
        """Hold `size` bytes in all (more or fewer than now). False, and nothing changed, when
        growing to it would pass the budget's total or the tenant's share."""
        if size == self.size:
            return True
        if not self.budget._resize(self.tenant, self.size, max(0, size)):
            return False
        self.size = max(0, size)
        return True

    def release(self) -> None:
        """Give every byte back (again: nothing)."""
        self.resize(0)

    def __enter__(self) -> Claim:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
