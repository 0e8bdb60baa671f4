"""The reopen ramp (backfill/routes/gates/ramp.py), pure: a rise of the route's limit restarts lines
at `initial` (or what already ran) and doubles every `double_every_s` up to it; a fall applies at
once; a closed gate ends the ramp. And how the scheduler's gate and status carry it."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from backfill.platform.messages import BatchSlot, SchedulerInput
from backfill.routes.gates import Gate, GateContext, ramped
from backfill.routes.gates.ramp import RampState, ReopenRamp, ramp
from backfill.routes.reasons import WaitReason
from backfill.routes.settings import RouteSettings
from workflows.scheduler_view import effective_cap, scheduler_status

T0 = 1_700_000_000.0
SLOW_START = ReopenRamp(initial=1, double_every_s=2.0)


def limits(
    setting: ReopenRamp, steps: list[tuple[float, int, int]], state: RampState | None = None
) -> list[tuple[int, float | None]]:
    """(limit, wake_at) after each (seconds after T0, target, running), the state carried."""
    out = []
    for at, target, running in steps:
        step = ramp(setting, state, target, running, T0 + at)
        state = step.state
        out.append((step.limit, step.wake_at))
    return out


def test_a_reopen_restarts_at_one_line_and_doubles_up_to_the_limit() -> None:
    assert limits(
        SLOW_START,
        [
            (0, 8, 0),  # the first decision takes the limit as it finds it
            (1, 0, 8),  # a gate closes: nothing new starts
            (10, 8, 0),  # it reopens, the lines have ended: one line
            (11, 8, 1),  # woken by something else meanwhile: still one
            (12, 8, 1),  # the timers the scheduler sets, one per doubling
            (14, 8, 2),
            (16, 8, 4),
            (30, 8, 8),
        ],
    ) == [
        (8, None),
        (0, None),
        (1, T0 + 12),
        (1, T0 + 12),
        (2, T0 + 14),
        (4, T0 + 16),
        (8, None),
        (8, None),
    ]


def test_lines_still_running_at_a_reopen_are_no_burst() -> None:
    # The gate closed and reopened before the 6 running lines ended: it ramps from 6.
    assert limits(SLOW_START, [(0, 8, 0), (1, 0, 6), (2, 8, 6), (4, 8, 6)]) == [
        (8, None),
        (0, None),
        (6, T0 + 4),
        (8, None),
    ]
    # All 8 still running: nothing to ramp.
    assert limits(SLOW_START, [(0, 8, 0), (1, 0, 8), (2, 8, 8)])[-1] == (8, None)


def test_a_raised_limit_ramps_from_the_one_it_replaces() -> None:
    # Seat-aware admission frees seats: 3 → 16 goes 3, 6, 12, 16, never 3 → 16.
    assert limits(SLOW_START, [(0, 3, 3), (1, 16, 3), (3, 16, 6), (5, 16, 12), (7, 16, 16)]) == [
        (3, None),
        (3, T0 + 3),
        (6, T0 + 5),
        (12, T0 + 7),
        (16, None),
    ]
    # A larger `initial` starts there.
    assert limits(ReopenRamp(initial=4), [(0, 0, 0), (1, 32, 0)])[-1] == (4, T0 + 2)


def test_a_limit_that_falls_applies_at_once_and_one_that_rises_keeps_the_pace() -> None:
    assert limits(
        SLOW_START,
        [
            (0, 0, 0),
            (1, 16, 0),  # ramp from 1 at T0 + 1
            (3, 16, 1),  # 2
            (4, 20, 2),  # the limit rises meanwhile: the ramp goes on at its pace
            (5, 20, 2),  # 4
            (6, 3, 4),  # the limit falls below the ramp: at once, the ramp is over
            (7, 16, 3),  # a new rise ramps again, from 3
        ],
    ) == [
        (0, None),
        (1, T0 + 3),
        (2, T0 + 5),
        (2, T0 + 5),
        (4, T0 + 7),
        (3, None),
        (3, T0 + 9),
    ]


def test_a_gate_closing_mid_ramp_ends_it_and_the_next_reopen_starts_over() -> None:
    assert limits(SLOW_START, [(0, 0, 0), (1, 8, 0), (3, 8, 2), (4, 0, 2), (9, 8, 0)]) == [
        (0, None),
        (1, T0 + 3),
        (2, T0 + 5),
        (0, None),
        (1, T0 + 11),
    ]


def test_a_ramp_that_began_long_ago_is_over() -> None:
    state = RampState(allowed=1, start=1, since=T0 - 86_400 * 365)
    step = ramp(ReopenRamp(double_every_s=0.5), state, 256, 0, T0)
    assert (step.limit, step.wake_at, step.state) == (256, None, RampState(allowed=256))


def test_the_timer_of_a_doubling_finds_it_due() -> None:
    # A doubling time that floating point cannot hold exactly (T0 + 0.1 + 3 × 0.7).
    state = RampState(allowed=4, start=1, since=T0 + 0.1)
    setting = ReopenRamp(double_every_s=0.7)
    wake = ramp(setting, state, 64, 4, T0 + 0.1 + 2 * 0.7).wake_at
    assert wake is not None
    step = ramp(setting, state, 64, 4, wake)
    assert step.limit == 8 and step.wake_at is not None and step.wake_at > wake


@pytest.mark.parametrize(
    "doc", [{"initial": 0}, {"initial": 257}, {"double_every_s": 0.1}, {"double_every_s": 7200}]
)
def test_the_setting_is_validated(doc: dict[str, float]) -> None:
    with pytest.raises(ValidationError):
        RouteSettings.model_validate({"reopen_ramp": doc})


def ctx(at: float, batch_lines: int = 0, cap: int = 8) -> GateContext:
    return GateContext(now=datetime.fromtimestamp(at, UTC), batch_lines=batch_lines, cap=cap)


def test_the_scheduler_s_gate_carries_the_ramp_its_timer_and_its_reason() -> None:
    setting = ReopenRamp(initial=1, double_every_s=2.0)
    # Closed a moment ago; the gates open again, a window's edge due at T0 + 3.
    gate, state = ramped(Gate(True, wake_at=T0 + 3), setting, RampState(allowed=0), ctx(T0))
    assert gate == Gate(True, wake_at=T0 + 2, limit=1, ramping_to=8)
    assert effective_cap(8, gate) == 1
    # The next doubling comes after the window's edge: the edge wakes first.
    gate, state = ramped(Gate(True, wake_at=T0 + 3), setting, state, ctx(T0 + 2))
    assert (gate.limit, gate.wake_at, gate.ramping_to) == (2, T0 + 3, 8)
    # A seat-aware limit of 3 is what it ramps to; reached, the gate is the gates' own.
    gate, state = ramped(Gate(True, limit=3), setting, state, ctx(T0 + 4))
    assert gate == Gate(True, limit=3) and state == RampState(allowed=3)
    closed = Gate(False, WaitReason.LIVE)
    assert ramped(closed, setting, state, ctx(T0 + 5)) == (closed, RampState(allowed=0))

    slot = BatchSlot(batch_id="b", workspace="w", wanted=10, allotment=1, held=1)
    s = SchedulerInput(route_id="r", settings=RouteSettings(max_concurrent_lines=8))
    s.batches = {"b": slot}
    ramping = Gate(True, wake_at=T0 + 2, limit=1, ramping_to=8)
    status = scheduler_status(s, ramping, T0)
    assert (status.limit, status.ramping_to, status.reason) == (1, 8, WaitReason.RAMP)
    assert status.batches[0].reason == WaitReason.RAMP and WaitReason.RAMP.legitimate
    settled = scheduler_status(s, Gate(True), T0)
    assert (settled.limit, settled.ramping_to, settled.reason) == (8, None, WaitReason.AT_LIMIT)


def test_off_by_default() -> None:
    assert RouteSettings().model_dump()["reopen_ramp"] is None
