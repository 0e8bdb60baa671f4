"""The route chart's samples: running batch lines, the limit and live requests in flight.

Kept in the api process's memory, per route, for the last `WINDOW_SECONDS`. A sample is taken
when a route page is served (the page refreshes itself every few seconds while open), at most
one per `MIN_SPACING_SECONDS` per route, from the same status document the management API
serves. Nothing samples while nobody looks; each api replica keeps its own samples.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

WINDOW_SECONDS = 15 * 60
MIN_SPACING_SECONDS = 2.0
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

    def due(self, route: str, now: float) -> bool:
        """Whether a new sample should be taken for this route now."""
        kept = self.by_route.get(route)
        return not kept or now - kept[-1].at >= MIN_SPACING_SECONDS

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
