"""Seat-aware admission (backfill/routes/gates/seats.py), pure: the allotment is the seats live
traffic leaves, a number the scheduler applies as min(cap, limit), and 0 closes the gate."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from backfill.routes.gates import GateContext, route_gate
from backfill.routes.gates.live import LIVE_REPORT_TTL, LiveCount
from backfill.routes.gates.seats import READING_FRESH_SECONDS, SeatAware, decide
from backfill.routes.gates.server_load import LoadReading, LoadVerdict
from backfill.routes.reasons import WaitReason
from backfill.routes.settings import RouteSettings
from workflows.scheduler_view import effective_cap

NOW = 1_000_000.0


def ctx(
    live: int = 0, running: float | None = None, read_at: float = NOW, **kw: Any
) -> GateContext:
    load = None
    if running is not None:
        reading = LoadReading(running=running, read_at=int(read_at))
        load = LoadVerdict(state="open", reading=reading)
    counts = {"api-1": LiveCount(in_flight=live, at=NOW)} if live else {}
    states = {"live": counts, "load": load}
    return GateContext(now=datetime.fromtimestamp(NOW, UTC), states=states, **kw)


def test_the_allotment_is_the_seats_left_clamped_to_the_cap() -> None:
    seats = SeatAware(seats=16, keep_free=2)
    assert decide(seats, ctx(cap=256)).limit == 14
    assert decide(seats, ctx(cap=8)).limit == 8  # never above "Batch lines at once"
    assert decide(seats, ctx(live=5, cap=256)).limit == 9
    # The server runs 12: 4 of them are the route's batch lines, 8 are someone else's.
    assert decide(seats, ctx(live=5, running=12, batch_lines=4, cap=256)).limit == 1


def test_no_seat_left_closes_the_gate_until_a_live_count_expires() -> None:
    answer = decide(SeatAware(seats=16, keep_free=2), ctx(live=14, cap=8))
    assert (answer.open, answer.reason, answer.limit) == (False, WaitReason.SEATS, None)
    assert answer.wake_at == NOW + LIVE_REPORT_TTL
    assert WaitReason.SEATS.legitimate
    assert not decide(SeatAware(seats=4), ctx(live=2, running=9, batch_lines=0, cap=8)).open


def test_an_old_or_missing_reading_is_not_counted() -> None:
    seats = SeatAware(seats=16, keep_free=0)
    fresh = decide(seats, ctx(running=10, read_at=NOW - 1, cap=256))
    assert (fresh.limit, fresh.wake_at) == (6, NOW - 1 + READING_FRESH_SECONDS)
    old = decide(seats, ctx(running=10, read_at=NOW - READING_FRESH_SECONDS, cap=256))
    assert old.limit == 16
    assert decide(seats, ctx(cap=256)).limit == 16


def test_off_by_default_and_the_scheduler_applies_the_limit() -> None:
    at = ctx(live=3, cap=8)
    off = route_gate(RouteSettings(max_concurrent_lines=8), at)
    assert off.open and off.limit is None and effective_cap(8, off) == 8
    on = route_gate(RouteSettings(max_concurrent_lines=8, seat_aware={"seats": 8}), at)
    assert on.open and on.limit == 5 and effective_cap(8, on) == 5
    closed = route_gate(RouteSettings(seat_aware={"seats": 8, "keep_free": 5}), at)
    assert (closed.open, closed.reason, effective_cap(8, closed)) == (False, WaitReason.SEATS, 0)


@pytest.mark.parametrize(
    "doc",
    [{"seats": 0}, {"seats": 100_001}, {"seats": 4, "keep_free": 4}, {"seats": 4, "keep_free": -1}],
)
def test_settings_are_validated(doc: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        RouteSettings.model_validate({"seat_aware": doc})
    assert RouteSettings.model_validate({"seat_aware": {"seats": 16, "keep_free": 2}})
