"""The route chart's samples: running batch lines, the limit and live requests in flight.

Kept in the api process's memory, per route, for the last `WINDOW_SECONDS`, taken in the
background by `api/console/sampler.py` every few seconds; each api replica keeps its own.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

WINDOW_SECONDS = 15 * 60
MIN_SPACING_SECONDS = 2.0
"""The closest two samples are ever taken (the deque's bound follows from it)."""
MAX_SAMPLES = int(WINDOW_SECONDS / MIN_SPACING_SECONDS) + 1


@dataclass(frozen=True)
class RouteSample:
    at: float
    """Unix seconds."""
    running: int
    limit: int
    live: int


@dataclass
class RouteSamples:
    by_route: dict[str, deque[RouteSample]] = field(default_factory=dict)

    def add(self, route: str, sample: RouteSample) -> None:
        kept = self.by_route.setdefault(route, deque(maxlen=MAX_SAMPLES))
        kept.append(sample)

    def recent(self, route: str, now: float) -> list[RouteSample]:
        """The route's samples of the last `WINDOW_SECONDS`, oldest first."""
        kept = self.by_route.get(route)
        if not kept:
            return []
        while kept and now - kept[0].at > WINDOW_SECONDS:
            kept.popleft()
        return list(kept)
