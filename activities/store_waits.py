"""Validation and finalizing through a storage outage: an attempt that failed because the file
store is unavailable (`backfill.files.outage`) is raised as a retryable `StoreUnavailable`, which
the batch workflow's retry policy tries again until the batch's deadline
(`backfill.batches.storage_waits`); any other error is raised non-retryable at once, typed by its
class.

Each worker counts the batches it saw waiting (`gateway_batches_waiting_on_store`, the
`BackfillStoreUnavailable` alert): a batch counts from its attempt that failed until one
succeeds or fails for another reason, or until `WAITING_FOR_SECONDS` pass without another
failed attempt here (its next attempt may land on another worker)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError

from backfill.batches.storage_waits import MAX_INTERVAL_SECONDS, STORE_UNAVAILABLE
from backfill.files.outage import store_unavailable
from backfill.platform import metrics

T = TypeVar("T")

WAITING_FOR_SECONDS = 3 * MAX_INTERVAL_SECONDS
"""How long a failed attempt keeps its batch counted as waiting without another one."""
MESSAGE_CHARS = 300
"""Most characters of a permanent error's message passed on to the workflow (the worker's log
has it whole, with its traceback)."""
MAX_TRACKED = 10_000
"""Most batches a worker tracks as waiting (the oldest are forgotten first)."""


class StoreWaits:
    """The batches this worker saw waiting on the store, by the time of their last failed
    attempt (thread-safe: attempts end in worker threads, scrapes in the exporter's)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()

    def failed(self, batch_id: str) -> None:
        with self._lock:
            self._last.pop(batch_id, None)
            self._last[batch_id] = self._clock()
            while len(self._last) > MAX_TRACKED:
                del self._last[next(iter(self._last))]

    def ended(self, batch_id: str) -> None:
        with self._lock:
            self._last.pop(batch_id, None)

    def waiting(self) -> int:
        """Batches whose last failed attempt here is recent; older ones are forgotten."""
        cutoff = self._clock() - WAITING_FOR_SECONDS
        with self._lock:
            for batch_id in [b for b, t in self._last.items() if t < cutoff]:
                del self._last[batch_id]
            return len(self._last)


WAITS = StoreWaits()
metrics.BATCHES_WAITING_ON_STORE.set_function(WAITS.waiting)


async def through_outages(step: str, batch_id: str, work: Callable[[], T]) -> T:
    """`work()` in a thread, its errors typed for the workflow's retry policy (module doc)."""
    try:
        result = await asyncio.to_thread(work)
    except Exception as err:
        if store_unavailable(err):
            WAITS.failed(batch_id)
            metrics.STORE_UNAVAILABLE.labels(step).inc()
            attempt = activity.info().attempt
            activity.logger.warning(
                "%s of %s: the file store is unavailable (attempt %d, %s); trying again",
                step,
                batch_id,
                attempt,
                type(err).__name__,
            )
            # Without its cause: Temporal keeps a pending activity's last failure only under
            # 4 KB, and a boto error's chain is longer (the type is then lost with it).
            raise ApplicationError(
                f"the file store is unavailable ({type(err).__name__})", type=STORE_UNAVAILABLE
            ) from None
        WAITS.ended(batch_id)
        activity.logger.exception("%s of %s failed on the file store", step, batch_id)
        raise ApplicationError(
            f"{step} failed: {type(err).__name__}: {str(err)[:MESSAGE_CHARS]}",
            type=type(err).__name__,
            non_retryable=True,
        ) from None
    WAITS.ended(batch_id)
    return result
