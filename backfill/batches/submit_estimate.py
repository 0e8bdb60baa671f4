"""The estimate at submit: when a new batch should finish and whether its window looks
achievable, from each route's recent batch throughput and the work queued before it. Pure: the
api reads the usage journal and asks the schedulers, then passes the numbers and `now` in
(`api/batches/submit_estimate.py`); docs/batches.md says what the estimate means
(docs/decisions/0041-estimate-at-submit.md, 0051-estimate-from-busy-minutes.md).

- **Throughput while serving, per hour of the week.** For each hour of the history (the
  `HISTORY_WEEKS` weeks before `now`, the current hour included), the batch lines a route
  served (answered 200) over the minutes in which it served any (`Served.rate`): an hour in
  which one batch took 5 minutes reads as that batch's pace, not as a twelfth of it. Each hour
  of the week (UTC, Monday 00:00 is 0) reads the most of any week's same hour: an hour with
  little work queued shows a slow pace, whatever the route could have done.
- **The pace now.** An hour of the week without history takes the route's pace of the current
  hour, else of the hour before (a route served for the first time an hour ago has one); else
  it has none and counts as serving nothing.
- **Work queued before it.** Shares are fair between batches, so a new batch of `n` lines
  finishes when the route has served its `n` plus, of each batch already there, as many of its
  lines as it still wants, at most `n` (`lines_ahead`: processor sharing).
- **The finish.** That work, consumed hour by hour from now at each hour's rate.
- **Said only on evidence.** A finish by `expires_at` is achievable. A finish after it (or none
  within the horizon) is a likely miss only when every hour of the window had history of its
  own (the weekly profile, not the pace now carried on): otherwise the window is unknown
  (`window_achievable` None), and so is the finish when an hour before it had no pace at all.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

HOUR = 3600
MINUTE = 60
WEEK_HOURS = 168
HISTORY_WEEKS = 4
MONDAY_OFFSET_HOURS = 72
"""1970-01-01 was a Thursday: hours from the Monday 00:00 UTC before it."""
HORIZON_HOURS = 2 * WEEK_HOURS
"""How far past `expires_at` the walk looks for the finish before giving up (None)."""


def hour_of_week(t: float) -> int:
    """0 (Monday 00:00-01:00 UTC) to 167 (Sunday 23:00-24:00)."""
    return (int(t // HOUR) + MONDAY_OFFSET_HOURS) % WEEK_HOURS


@dataclass(frozen=True)
class Served:
    """What a route served of batches in one hour."""

    lines: int
    """Batch lines answered 200."""
    busy_minutes: int
    """The minutes of the hour in which at least one of them ended (1 to 60)."""

    @property
    def rate(self) -> float:
        """Lines per hour while it served: `lines` over its busy minutes."""
        return self.lines * (HOUR / MINUTE) / max(1, self.busy_minutes)


@dataclass(frozen=True)
class Pace:
    """A route's lines per hour for any hour ahead."""

    profile: Sequence[float | None]
    """By hour of the week: the most of the history's same hours; None where none served."""
    now: float | None
    """The pace of the current hour, else the hour before; None when neither served a line."""

    def rate(self, t: float) -> float | None:
        """Lines per hour at `t`: its hour of the week's, else the pace now; None: no pace."""
        seen = self.profile[hour_of_week(t)]
        return seen if seen is not None else self.now

    def seen_until(self, start: float, end: float) -> bool:
        """Every hour from `start` to `end` has history of its own in the profile."""
        t = float(start)
        while t < end:
            if self.profile[hour_of_week(t)] is None:
                return False
            t = (int(t // HOUR) + 1) * HOUR
        return True


def weekly_profile(
    served: Mapping[int, Served], now: float, weeks: int = HISTORY_WEEKS
) -> list[float | None]:
    """Lines per hour while serving for each hour of the week, from `served` (start of an
    hour, unix seconds → what the route served in it): the most of any hour from `weeks` weeks
    before `now` to the current one (included: its minutes so far are as good a pace). None
    for an hour of the week in which it served nothing."""
    current = int(now) // HOUR * HOUR
    start = current - weeks * WEEK_HOURS * HOUR
    slots: list[float | None] = [None] * WEEK_HOURS
    for hour, s in served.items():
        if start <= hour <= current and s.lines > 0:
            slot = hour_of_week(hour)
            seen = slots[slot]
            slots[slot] = s.rate if seen is None else max(seen, s.rate)
    return slots


def pace_now(served: Mapping[int, Served], now: float) -> float | None:
    """The pace of the current hour if the route served a line in it, else of the hour before."""
    current = int(now) // HOUR * HOUR
    for hour in (current, current - HOUR):
        s = served.get(hour)
        if s is not None and s.lines > 0:
            return s.rate
    return None


def pace_of(served: Mapping[int, Served], now: float) -> Pace:
    return Pace(weekly_profile(served, now), pace_now(served, now))


def lines_ahead(lines: int, wanted: Iterable[int]) -> int:
    """Lines of the batches already on a route that a new batch of `lines` shares the route
    with before it finishes, shares being fair: of each, what it still wants, at most `lines`."""
    return sum(min(max(w, 0), lines) for w in wanted)


@dataclass(frozen=True)
class Walk:
    finish: float | None
    """When the work is served; None if not by `until`."""
    paced: bool
    """Every hour up to the finish (or `until`) had a pace (none counted as serving nothing
    for want of one)."""


def finish_at(work: float, pace: Pace, now: float, until: float) -> Walk:
    """When `work` lines are served from `now` on, each hour at its pace (an hour without one
    serves nothing)."""
    t, left = float(now), float(work)
    paced = True
    if left <= 0:
        return Walk(t, paced)
    while t < until:
        hour_end = (int(t // HOUR) + 1) * HOUR
        rate = pace.rate(t)
        if rate is None:
            paced, rate = False, 0.0
        can = rate * (hour_end - t) / HOUR
        if rate > 0 and can >= left:
            return Walk(t + left / rate * HOUR, paced)
        left -= can
        t = hour_end
    return Walk(None, paced)


@dataclass(frozen=True)
class RouteWork:
    """What the estimate knows of one route the batch's lines go to."""

    route_id: str
    lines: int
    """The batch's lines on this route."""
    wanted: tuple[int, ...]
    """Lines each batch already on the route still wants (the scheduler's view)."""
    served: Mapping[int, Served]
    """What the route served of batches per hour (start of the hour → `Served`)."""


@dataclass(frozen=True)
class Estimate:
    expected_finish_at: int | None
    """Unix seconds; None when unknown (an hour before it without a pace) or not within the
    horizon."""
    window_achievable: bool | None
    """The expected finish is by `expires_at` (True), or the history of every hour of the
    window says it is not (False); None when the evidence does not say."""
    lines_ahead: int
    """Lines of the batches already there that share the routes before it finishes."""


def route_estimate(
    r: RouteWork, *, now: float, expires_at: float
) -> tuple[float | None, bool | None]:
    """One route's (finish, window achievable), as `Estimate` says them."""
    pace = pace_of(r.served, now)
    until = max(expires_at, now) + HORIZON_HOURS * HOUR
    walk = finish_at(r.lines + lines_ahead(r.lines, r.wanted), pace, now, until)
    if walk.finish is not None and walk.finish <= expires_at:
        return walk.finish, True  # an hour without a pace can only have added to it
    if pace.seen_until(now, expires_at):
        return walk.finish, False  # every hour of the window served at most this
    if walk.finish is not None and walk.paced:
        return walk.finish, None  # the pace now carried on says late; no history says so
    return None, None


def estimate(routes: Sequence[RouteWork], *, now: float, expires_at: float) -> Estimate:
    """The batch's estimate: the latest of its routes' finishes; a likely miss when one route's
    history says so, achievable when every route's finish is by `expires_at`."""
    ahead = sum(lines_ahead(r.lines, r.wanted) for r in routes)
    if not routes:
        return Estimate(None, None, ahead)
    each = [route_estimate(r, now=now, expires_at=expires_at) for r in routes]
    finishes = [f for f, _ in each]
    verdicts = [v for _, v in each]
    last = None if any(f is None for f in finishes) else max(f for f in finishes if f is not None)
    if False in verdicts:
        achievable: bool | None = False
    elif all(v is True for v in verdicts):
        achievable = True
    else:
        achievable = None
    return Estimate(None if last is None else int(last), achievable, ahead)


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
