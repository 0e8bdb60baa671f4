"""Reports on preemptive yield's channel that did not arrive: counted, and logged at warning.

A worker the channel cannot reach cannot preempt for live traffic (an api's counts) or counts
too few lines (another worker's): an operator must see it. Every failure is counted
(`gateway_preempt_send_failures_total{path,reason}`); a warning names the address and the cause,
at most once per `LOG_EVERY` seconds per address and cause, with how many were not logged since
(reports go out every second to every worker: one line each would flood the log).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Literal

from backfill.platform.metrics import PREEMPT_SEND_FAILURES

LOG_EVERY = 60.0
"""Seconds between two warnings for the same address and cause."""
MAX_KEYS = 1024
"""(address, cause) pairs remembered at once: the addresses are the workers found, bounded."""

Reason = Literal["unreachable", "refused"]


class SendFailures:
    """Counts and logs one sender's failed reports (`path`: `live` or `lines`)."""

    def __init__(
        self, path: str, log: logging.Logger, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.path = path
        self._log = log
        self._clock = clock
        self._logged: dict[tuple[str, str], tuple[float, int]] = {}
        """(address, cause) -> when last logged, failures not logged since."""

    def failed(self, address: str, reason: Reason, cause: str) -> None:
        PREEMPT_SEND_FAILURES.labels(self.path, reason).inc()
        now = self._clock()
        key = (address, cause if reason == "refused" else reason)
        at, skipped = self._logged.get(key, (float("-inf"), 0))
        if now - at < LOG_EVERY:
            self._logged[key] = (at, skipped + 1)
            return
        if key not in self._logged and len(self._logged) >= MAX_KEYS:
            self._logged = {k: v for k, v in self._logged.items() if now - v[0] < LOG_EVERY}
        self._logged[key] = (now, 0)
        more = f" ({skipped} more since the last warning)" if skipped else ""
        self._log.warning(
            "preemption channel: %s report to %s not taken (%s): %s%s",
            self.path,
            address,
            reason,
            cause,
            more,
        )
