"""The time-window gate: is a route's window open at `now`, and when does that next change?

Pure and deterministic (standard library and pydantic only, no I/O besides reading the pinned
`tzdata` package once per zone, no clock): the route scheduler calls it with `workflow.now()`.
Import it inside `workflow.unsafe.imports_passed_through()`: `zoneinfo` objects are restricted
proxies in the workflow sandbox, a passed-through module uses the real ones.

Rules (issue 9 and decision 0010, docs/decisions/0010-time-window-rules.md):

- `days` are the local days a window **starts**. `from_` < `until`: the same day;
  `until` < `from_`: it ends on the next day (spans midnight); `from_` == `until`: the whole day,
  from `from_` on a listed day to `from_` on the next day.
- Windows follow the wall clock, so a window over a clock change is an hour shorter or longer.
- A start that falls in a skipped (spring-forward) hour: the window does not open that day.
- A start in a repeated (fall-back) hour: it opens at the first occurrence.
- An end in a skipped hour: it ends at the first instant after the gap (the moment the clocks
  jump, e.g. 03:00 new time for an end of 02:30).
- An end in a repeated hour: it ends at the first occurrence.

Zones are read from the `tzdata` package (pinned in pyproject), never from the host's
`/usr/share/zoneinfo`, so every worker computes the same boundaries and replays agree.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from functools import lru_cache
from importlib import resources
from typing import Literal
from zoneinfo import ZoneInfo

from pydantic import BaseModel, ConfigDict, Field, field_validator

from backfill.routes.gates.base import FormField, GateAnswer, GateContext, GateEntry
from backfill.routes.reasons import WaitReason

__all__ = [
    "DAYS",
    "ENTRY",
    "Day",
    "TimeWindow",
    "WindowState",
    "is_open",
    "load_zone",
    "next_change",
    "window_state",
]

Day = Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
DAYS: tuple[Day, ...] = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
"""Day names in `date.weekday()` order."""

SCAN_DAYS = 400
"""How far ahead `next_change` looks: over a year, and clock changes recur yearly. Only a
whole-day window on all seven days can go that long without a change (it closes only on a day
whose start is skipped); past this horizon it reports no change. That case costs a few ms per
call, every other window well under 0.1 ms."""

_ZONE_NAME = re.compile(r"[A-Za-z0-9_+-]+(?:/[A-Za-z0-9_+-]+)*")
_HH_MM = re.compile(r"([01][0-9]|2[0-3]):([0-5][0-9])")


@lru_cache(maxsize=128)
def load_zone(name: str) -> ZoneInfo:
    """The IANA zone `name` from the pinned `tzdata` package; ValueError when there is none."""
    if not _ZONE_NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not an IANA time zone name (e.g. 'Europe/Berlin')")
    try:
        with resources.files("tzdata.zoneinfo").joinpath(*name.split("/")).open("rb") as f:
            return ZoneInfo.from_file(f, key=name)
    except (OSError, ValueError):
        raise ValueError(f"unknown IANA time zone {name!r} (e.g. 'Europe/Berlin')") from None


class TimeWindow(BaseModel):
    """The hours a route may start batch lines, as in the settings document's `time_window`."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        populate_by_name=True,
        serialize_by_alias=True,
        use_attribute_docstrings=True,
    )

    time_zone: str
    """IANA time zone name, e.g. `America/New_York`."""
    days: list[Day] = Field(min_length=1)
    """Local days a window starts on ("mon" … "sun"); non-empty, each at most once."""
    from_: str = Field(alias="from")
    """Local start, "HH:MM" on a 24-hour clock (00:00–23:59)."""
    until: str
    """Local end, "HH:MM"; earlier than `from` ends the next day, equal means the whole day."""

    @field_validator("time_zone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        load_zone(value)
        return value

    @field_validator("days")
    @classmethod
    def _unique_days(cls, value: list[Day]) -> list[Day]:
        for day in DAYS:
            if value.count(day) > 1:
                raise ValueError(f"{day!r} is listed more than once")
        return value

    @field_validator("from_", "until")
    @classmethod
    def _hh_mm(cls, value: str) -> str:
        if not _HH_MM.fullmatch(value):
            raise ValueError(f"expected a 24-hour time HH:MM (00:00 to 23:59), got {value!r}")
        return value

    @property
    def start(self) -> time:
        return time(int(self.from_[:2]), int(self.from_[3:]))

    @property
    def end(self) -> time:
        return time(int(self.until[:2]), int(self.until[3:]))


@dataclass(frozen=True)
class WindowState:
    open: bool
    """Whether a window is open at the instant asked about."""
    next_change: datetime | None
    """The next instant (UTC, strictly later) at which `open` flips; None: not within
    `SCAN_DAYS` (a whole-day window on every day)."""


def is_open(window: TimeWindow, now: datetime) -> bool:
    """Whether `window` is open at `now` (a timezone-aware instant)."""
    return window_state(window, now).open


def next_change(window: TimeWindow, now: datetime) -> datetime | None:
    """The next instant after `now` at which `is_open` flips (UTC), or None if it never does
    within `SCAN_DAYS`."""
    return window_state(window, now).next_change


def window_state(window: TimeWindow, now: datetime) -> WindowState:
    """`is_open` and `next_change` in one pass."""
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError("now must be timezone-aware (e.g. workflow.now())")
    now = now.astimezone(UTC)
    zone = load_zone(window.time_zone)
    today = now.astimezone(zone).date()
    # A window lasts at most a day and a bit, so one that started two local days ago has ended.
    occurrences = _occurrences(window, zone, today - timedelta(days=2), today + _SCAN)
    for start, end in occurrences:
        if end <= now:
            continue
        if start > now:
            return WindowState(open=False, next_change=start)
        # Open: consecutive windows that touch (whole days) or overlap make one stretch.
        for next_start, next_end in occurrences:
            if next_start > end:
                return WindowState(open=True, next_change=end)
            end = max(end, next_end)
        return WindowState(open=True, next_change=None)
    return WindowState(open=False, next_change=None)


_SCAN = timedelta(days=SCAN_DAYS)
_DAY = timedelta(days=1)


def _occurrences(
    window: TimeWindow, zone: ZoneInfo, first: date, last: date
) -> Iterator[tuple[datetime, datetime]]:
    """[start, end) in UTC of each window starting on a listed day in first..last, in order."""
    days = {DAYS.index(d) for d in window.days}
    start_time, end_time = window.start, window.end
    day = first
    while day <= last:
        if day.weekday() in days:
            start = _to_utc(zone, datetime.combine(day, start_time), skip_gap=True)
            end_day = day if end_time > start_time else day + _DAY
            end = _to_utc(zone, datetime.combine(end_day, end_time), skip_gap=False)
            if start is not None and end is not None and end > start:
                yield start, end
        day += _DAY


def _to_utc(zone: ZoneInfo, wall: datetime, *, skip_gap: bool) -> datetime | None:
    """The instant local `wall` time names: its first occurrence if repeated; if skipped,
    None (`skip_gap`) or the first instant after the gap."""
    a = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    b = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    first, last = min(a, b), max(a, b)
    if _wall(zone, first) == wall:
        return first
    if _wall(zone, last) == wall:
        return last
    if skip_gap:
        return None
    # In a gap: local time jumps past `wall` at one instant in (first, last]; find it.
    lo, hi = int(first.timestamp()), int(last.timestamp())
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _wall(zone, datetime.fromtimestamp(mid, UTC)) > wall:
            hi = mid
        else:
            lo = mid
    return datetime.fromtimestamp(hi, UTC)


def _wall(zone: ZoneInfo, instant: datetime) -> datetime:
    return instant.astimezone(zone).replace(tzinfo=None, fold=0)


def decide(window: TimeWindow, ctx: GateContext) -> GateAnswer:
    """Closed outside the window; either way the answer changes at the window's next edge."""
    state = window_state(window, ctx.now)
    wake = state.next_change.timestamp() if state.next_change is not None else None
    if not state.open:
        return GateAnswer(False, WaitReason.WINDOW, wake_at=wake)
    return GateAnswer(True, wake_at=wake)


ENTRY = GateEntry(
    name="time_window",
    label="Time window",
    model=TimeWindow,
    decide=decide,
    doc='"Time window": lines start only inside it (null: any time).',
    off="any time",
    summary=lambda w: f"{', '.join(w.days)} {w.from_}–{w.until} ({w.time_zone})",
    form=(
        FormField("time_zone", "Time zone (IANA; blank: any time)", numeric=False),
        FormField("days", "Start days", choices=DAYS),
        FormField("from", "From (HH:MM)", numeric=False),
        FormField("until", "Until (HH:MM)", numeric=False),
    ),
)
