"""Live requests in flight per route, in this api process.

A live request counts on its route from the moment its route is known (right after its body is
parsed, before anything goes upstream) until the model server's answer is complete (its last byte
received, `api.live.relay` holding what the client has not read yet), the client disconnects, or
it fails: what the count measures is the model server's work, never a slow client's reading.
`LiveTraffic.take` (or `in_flight`) is the only way to count, and its `LiveCount` is released
once whatever ends it, so every exit path (error, cancellation, disconnect mid-stream) uncounts it.

One workspace counts at most its `share` of a route (`max_live_counted`, per process): its
requests beyond that are served but leave the route's count where it is, so the route counts
`sum over workspaces of min(in flight, share)` and one tenant alone cannot hold every batch off
(docs/decisions/0045-live-counts-measure-the-model-server.md). The counts are exported as the
Prometheus gauge `gateway_live_in_flight{route}` and read by the code that reports them to the
route schedulers (`snapshot()`, `subscribe()`; see docs/decisions/0009-live-traffic-reports.md).

It also keeps the times to first token of the streamed live requests of the last
`TTFT_WINDOW_S` seconds (`record_ttft`, `recent_ttft_ms`), which preemptive yield's live-latency
target reads (docs/decisions/0025).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import Gauge

log = logging.getLogger(__name__)

IN_FLIGHT = Gauge(
    "gateway_live_in_flight",
    "Live requests in flight on the route in this api process.",
    ["route"],
)

TTFT_WINDOW_S = 5.0
"""Seconds of streamed live requests `recent_ttft_ms` summarizes."""
TTFT_QUANTILE = 0.9

Listener = Callable[[str, int], None]
"""Called with (route id, new count) after every change, on the event loop's thread."""


class LiveTraffic:
    """Per-route in-flight counts of this process's live requests. One per app."""

    def __init__(
        self, routes: Iterable[str] = (), clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._counts: dict[str, int] = {}
        self._by_workspace: dict[tuple[str, str], int] = {}
        """(route, workspace): that workspace's requests in flight on the route, counted or not
        (only workspaces with some in flight)."""
        self._listeners: list[Listener] = []
        self._clock = clock
        self._ttfts: dict[str, deque[tuple[float, float]]] = {}
        for route in routes:
            self._counts[route] = 0
            IN_FLIGHT.labels(route)  # the series exists (at 0) before the first request

    def take(self, route: str, workspace: str = "", share: int | None = None) -> LiveCount:
        """Count one live request of `workspace` on `route` until the `LiveCount` is released.

        The route's count rises only while the workspace has fewer than `share` in flight there
        (None: no share), and falls on a release only when the workspace is back under it."""
        key = (route, workspace)
        n = self._by_workspace.get(key, 0) + 1
        self._by_workspace[key] = n
        if share is None or n <= share:
            self._change(route, +1)
        return LiveCount(self, route, workspace, share)

    def _release(self, route: str, workspace: str, share: int | None) -> None:
        key = (route, workspace)
        n = self._by_workspace.get(key, 0) - 1
        if n > 0:
            self._by_workspace[key] = n
        else:
            self._by_workspace.pop(key, None)
        if share is None or n < share:
            self._change(route, -1)

    @contextlib.contextmanager
    def in_flight(
        self, route: str, workspace: str = "", share: int | None = None
    ) -> Iterator[LiveCount]:
        """Count one live request on `route` for the body of the `with`, whatever ends it (or
        until its `LiveCount` is released sooner)."""
        count = self.take(route, workspace, share)
        try:
            yield count
        finally:
            count.release()

    def count(self, route: str) -> int:
        return self._counts.get(route, 0)

    def snapshot(self) -> dict[str, int]:
        """Every known route's current count (routes seen so far, zeros included)."""
        return dict(self._counts)

    def record_ttft(self, route: str, seconds: float) -> None:
        """A streamed live request on `route` got its first byte `seconds` after it arrived."""
        now = self._clock()
        window = self._ttfts.setdefault(route, deque())
        window.append((now, seconds))
        self._prune(window, now)

    def recent_ttft_ms(self, route: str) -> float | None:
        """The `TTFT_QUANTILE` (nearest rank) of the times to first token on `route` over the
        last `TTFT_WINDOW_S` seconds, in ms (None: no streamed request in that time)."""
        window = self._ttfts.get(route)
        if not window:
            return None
        self._prune(window, self._clock())
        if not window:
            return None
        values = sorted(v for _, v in window)
        return 1000.0 * values[max(0, math.ceil(TTFT_QUANTILE * len(values)) - 1)]

    @staticmethod
    def _prune(window: deque[tuple[float, float]], now: float) -> None:
        while window and now - window[0][0] > TTFT_WINDOW_S:
            window.popleft()

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call `listener` after every change; returns the function that unsubscribes it."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def _change(self, route: str, delta: int) -> None:
        count = self._counts.get(route, 0) + delta
        self._counts[route] = count
        IN_FLIGHT.labels(route).inc(delta)
        for listener in list(self._listeners):
            try:
                listener(route, count)
            except Exception:  # a reporter's bug must never break or leak the count
                log.exception("live-traffic listener failed")


class LiveCount:
    """One live request counted by `LiveTraffic.take`; `release` uncounts it, once (calling it
    again does nothing)."""

    def __init__(self, live: LiveTraffic, route: str, workspace: str, share: int | None) -> None:
        self._live, self._route, self._workspace, self._share = live, route, workspace, share
        self.held = True
        """Whether it still counts (not yet released)."""

    def release(self) -> None:
        if self.held:
            self.held = False
            self._live._release(self._route, self._workspace, self._share)
