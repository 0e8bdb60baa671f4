"""A line held back at a worker's door is never lost (issue 34, item 1): the door has a time
limit inside the activity's clock, after which the line goes back to its batch's queue (`held`,
nothing counted), and the seats held back for the live-latency target reach the route
scheduler's seat-aware allotment."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

from temporalio.testing import ActivityEnvironment

from activities.preemption.board import ADJUST_EVERY, DOOR_LIMIT, PreemptBoard
from backfill.platform.messages import LineOutcome
from backfill.routes.gates import seats as seats_gate
from backfill.routes.gates.base import GateContext
from backfill.routes.gates.live import LiveCount
from backfill.routes.gates.preempt import PreemptPolicy
from backfill.routes.gates.seats import (
    HELD_BACK_TTL,
    HeldBackCount,
    SeatAware,
    held_back_seats,
    keep_held_back,
)
from tests.unit.test_preemption import POLICY, Clock, hanging_upstream, preemptible, report
from tests.unit.test_run_line import BATCH, line
from workflows.line_activity import LINE_HEARTBEAT_SECONDS


def test_the_door_fits_in_the_activity_clock() -> None:
    # The activity's clock is the line timeout + 60 s: the door's wait must leave the request
    # its whole line timeout.
    assert DOOR_LIMIT + LINE_HEARTBEAT_SECONDS < 60


async def test_a_line_held_at_the_door_past_its_limit_goes_back_unsent(tmp_path: Path) -> None:
    transport, release, seen = hanging_upstream()
    board = PreemptBoard(door_limit=0.05)
    acts, file_id = await preemptible(tmp_path, transport, board)
    report(board, "r1", "api-a", 4, POLICY)  # live fills every shared seat
    inp = line(file_id, final=False).model_copy(update={"timeout_seconds": 30})
    outcome: LineOutcome = await asyncio.wait_for(ActivityEnvironment().run(acts.run_line, inp), 5)
    # Not sent, nothing committed, nothing wasted: the workflow puts it back in the queue.
    assert outcome.held and outcome.preempted and not outcome.ok and not outcome.retry
    assert outcome.wasted_tokens == 0 and outcome.error_code is None
    assert seen == [] and acts.store.get_result(BATCH, 0) is None
    assert board._routes["r1"].tickets == []  # it left the board
    # Live traffic leaves: the same line goes upstream and is committed.
    report(board, "r1", "api-a", 0, POLICY)
    release.set()
    again = await ActivityEnvironment().run(acts.run_line, inp)
    assert again.ok and seen == ["sent"]


def test_every_change_of_the_seats_held_back_is_handed_on() -> None:
    clock = Clock()
    changes: list[tuple[str, int]] = []
    board = PreemptBoard(clock, on_held_back=lambda route, n: changes.append((route, n)))
    target = PreemptPolicy(batch_seats=4, max_preemptions=100, ttft_target_ms=400)
    report(board, "r1", "api-a", 0, target, ttft_ms=900.0)
    clock.now += ADJUST_EVERY
    report(board, "r1", "api-a", 0, target, ttft_ms=900.0)
    clock.now += ADJUST_EVERY
    report(board, "r1", "api-a", 0, target, ttft_ms=390.0)  # between: kept, not handed on
    clock.now += ADJUST_EVERY
    report(board, "r1", "api-a", 0, POLICY)  # the target removed: nothing held back
    assert changes == [("r1", 1), ("r1", 2), ("r1", 0)]


def ctx(held: dict[str, HeldBackCount], at: float, live: int = 0) -> GateContext:
    return GateContext(
        now=datetime.fromtimestamp(at, UTC),
        states={
            "live": {"api": LiveCount(in_flight=live, at=at)} if live else {},
            "held_back": held,
        },
        cap=100,
    )


def test_the_seat_aware_allotment_leaves_the_held_back_seats_out() -> None:
    seats = SeatAware(seats=16, keep_free=2)
    held = keep_held_back({}, 100.0, "w1", 4)
    held = keep_held_back(held, 101.0, "w2", 6)
    # The most cautious fresh worker counts: 16 − 2 kept free − 6 held back − 3 live.
    answer = seats_gate.decide(seats, ctx(held, 102.0, live=3))
    assert answer.open and answer.limit == 5
    # Every shared seat held back: closed, and the detail says why.
    held = keep_held_back(held, 103.0, "w1", 14)
    closed = seats_gate.decide(seats, ctx(held, 104.0))
    assert not closed.open and closed.detail is not None and "14 held back" in closed.detail
    # It reopens when the report expires unrenewed (a dead worker): the gate wakes for it.
    assert closed.wake_at == 100.0 + HELD_BACK_TTL + 1
    assert held_back_seats(held, 103.0 + HELD_BACK_TTL) == 0
    # A report of 0 forgets the worker at once.
    assert keep_held_back(held, 105.0, "w1", 0) == {"w2": held["w2"]}
