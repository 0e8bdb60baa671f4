"""The estimate at submit: when a new batch should finish and whether its window looks
achievable, from each route's recent spare throughput and the work queued before it. Pure: the
api reads the usage journal and asks the schedulers, then passes the numbers and `now` in
(`api/submit_estimate.py`); docs/batches.md says what the estimate means.

- **Spare throughput, per hour of the week.** The batch lines a route served (answered 200) in
  each hour that ended within the last `HISTORY_WEEKS` weeks, by hour of the week (UTC, Monday
  00:00 is 0): each hour of the week reads the most any of those weeks served in it. The most,
  not the mean, because an hour with little batch work queued shows little served, whatever the
  route could have done; a nightly window that served batches at night reads as nightly.
- **Work queued before it.** Shares are fair between batches, so a new batch of `n` lines
  finishes when the route has served its `n` plus, of each batch already there, as many of its
  lines as it still wants, at most `n` (`lines_ahead`: processor sharing).
- **The finish.** That work, consumed hour by hour from now at each hour's rate. A route with
  no line served in the whole history has no estimate (None), nor has a batch that uses one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

HOUR = 3600
WEEK_HOURS = 168
HISTORY_WEEKS = 4
MONDAY_OFFSET_HOURS = 72
"""1970-01-01 was a Thursday: hours from the Monday 00:00 UTC before it."""
HORIZON_HOURS = 2 * WEEK_HOURS
"""How far past `expires_at` the walk looks for the finish before giving up (None)."""


def hour_of_week(t: float) -> int:
    """0 (Monday 00:00-01:00 UTC) to 167 (Sunday 23:00-24:00)."""
    return (int(t // HOUR) + MONDAY_OFFSET_HOURS) % WEEK_HOURS


def weekly_profile(
    served: Mapping[int, int], now: float, weeks: int = HISTORY_WEEKS
) -> list[float] | None:
    """Lines per hour for each hour of the week, from `served` (start of an hour, unix seconds
    → batch lines the route served in it): the most of any hour that ended within `weeks`
    weeks before `now` (the current hour is not counted). None when none served a line."""
    current = int(now) // HOUR * HOUR
    start = current - weeks * WEEK_HOURS * HOUR
    slots = [0.0] * WEEK_HOURS
    for hour, lines in served.items():
        if start <= hour < current and lines > 0:
            slot = hour_of_week(hour)
            slots[slot] = max(slots[slot], float(lines))
    return slots if any(slots) else None


def lines_ahead(lines: int, wanted: Iterable[int]) -> int:
    """Lines of the batches already on a route that a new batch of `lines` shares the route
    with before it finishes, shares being fair: of each, what it still wants, at most `lines`."""
    return sum(min(max(w, 0), lines) for w in wanted)


def finish_at(work: float, profile: Sequence[float], now: float, until: float) -> float | None:
    """When `work` lines are served from `now` on, each hour at its rate in `profile`; None if
    not by `until`."""
    t, left = float(now), float(work)
    if left <= 0:
        return t
    while t < until:
        hour_end = (int(t // HOUR) + 1) * HOUR
        rate = profile[hour_of_week(t)]
        can = rate * (hour_end - t) / HOUR
        if rate > 0 and can >= left:
            return t + left / rate * HOUR
        left -= can
        t = hour_end
    return None


@dataclass(frozen=True)
class RouteWork:
    """What the estimate knows of one route the batch's lines go to."""

    route_id: str
    lines: int
    """The batch's lines on this route."""
    wanted: tuple[int, ...]
    """Lines each batch already on the route still wants (the scheduler's view)."""
    served: Mapping[int, int]
    """Batch lines the route served per hour (start of the hour → lines)."""


@dataclass(frozen=True)
class Estimate:
    expected_finish_at: int | None
    """Unix seconds; None when unknown (no history) or not within the horizon."""
    window_achievable: bool | None
    """The expected finish is by `expires_at`; None when there is no estimate."""
    lines_ahead: int
    """Lines of the batches already there that share the routes before it finishes."""


def estimate(routes: Sequence[RouteWork], *, now: float, expires_at: float) -> Estimate:
    """The batch's estimate: the latest of its routes' finishes."""
    ahead = sum(lines_ahead(r.lines, r.wanted) for r in routes)
    if not routes:
        return Estimate(None, None, ahead)
    until = max(expires_at, now) + HORIZON_HOURS * HOUR
    finishes: list[float] = []
    for r in routes:
        profile = weekly_profile(r.served, now)
        if profile is None:
            return Estimate(None, None, ahead)
        done = finish_at(r.lines + lines_ahead(r.lines, r.wanted), profile, now, until)
        if done is None:
            return Estimate(None, False, ahead)
        finishes.append(done)
    last = max(finishes)
    return Estimate(int(last), last <= expires_at, ahead)


def split_lines(lines: int, weights: Sequence[int]) -> list[int]:
    """`lines` over routes of these weights, as the weighted routing spreads them (largest
    remainders; the counts sum to `lines`)."""
    total = sum(weights)
    if total <= 0:
        return [0 for _ in weights]
    exact = [lines * w / total for w in weights]
    counts = [int(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: counts[i] - exact[i])
    for i in order[: lines - sum(counts)]:
        counts[i] += 1
    return counts
