"""Exact preemption across workers (issue 34, item 2): each worker counts the other workers'
lines (`PreemptBoard.peer_lines`) and ends only its own among the youngest route-wide."""

from __future__ import annotations

import asyncio
import json

from activities.preemption import REPORT_TTL, PreemptBoard
from backfill.gates.preempt import PreemptPolicy
from tests.unit.test_preemption import Clock
from worker.preempt_channel import LINES_PATH, PreemptChannel

POLICY = PreemptPolicy(batch_seats=3, max_preemptions=100)


async def sent_line(board: PreemptBoard, clock: Clock, at: float, route: str = "r1") -> object:
    clock.now = at
    ticket = board.enter(route, 0)
    assert await board.door(ticket)
    return ticket


async def test_the_youngest_line_route_wide_is_ended_by_its_own_worker_only() -> None:
    clock_a, clock_b = Clock(), Clock()
    a, b = PreemptBoard(clock_a), PreemptBoard(clock_b)
    for board in (a, b):
        board.set_policy("r1", POLICY)
    older = await sent_line(a, clock_a, 1000.0)  # A: one line, the oldest
    b1 = await sent_line(b, clock_b, 1001.0)
    b2 = await sent_line(b, clock_b, 1002.0)  # B: two lines, the youngest route-wide
    clock_a.now = clock_b.now = 1003.0
    a.peer_lines("r1", "B", b.own_lines("r1"))
    b.peer_lines("r1", "A", a.own_lines("r1"))
    # One live request needs one of the 3 shared seats: every worker sees 3 lines + 1 live.
    assert a.report("r1", "api", 1) == 0  # its line is not the youngest
    assert b.report("r1", "api", 1) == 1
    assert [t.preempted.is_set() for t in (older, b1, b2)] == [False, False, True]  # type: ignore[attr-defined]
    # B tells A; a second report changes nothing (none twice, never more than needed).
    a.peer_lines("r1", "B", b.own_lines("r1"))
    assert a.report("r1", "api", 1) == 0 and b.report("r1", "api", 1) == 0


async def test_the_door_counts_the_other_workers_lines_until_they_go_silent() -> None:
    clock = Clock()
    board = PreemptBoard(clock, door_limit=0.05)
    board.set_policy("r1", POLICY)
    board.report("r1", "api", 0)
    board.peer_lines("r1", "B", [(1.0, True), (2.0, True), (3.0, True)])  # every shared seat
    waiting = asyncio.ensure_future(board.door(board.enter("r1", 0)))
    await asyncio.sleep(0.01)
    clock.now += 1  # past the door's limit: the line goes back unsent
    assert await asyncio.wait_for(waiting, 1) is False
    clock.now += REPORT_TTL  # B stopped reporting: forgotten
    board.report("r1", "api", 0)
    assert await board.door(board.enter("r1", 0))


async def test_a_lines_report_needs_a_configured_route_and_bounded_lines() -> None:
    board = PreemptBoard()
    channel = PreemptChannel(board, asyncio.get_running_loop(), "t", ["r1"], worker="me")
    auth = "Bearer t"

    def body(**fields: object) -> bytes:
        return json.dumps({"worker": "B", "route": "r1", "lines": [[1.5, True]], **fields}).encode()

    assert channel.handle(auth, body(), LINES_PATH) == 204
    assert channel.handle(auth, body(route="nope"), LINES_PATH) == 400
    assert channel.handle(auth, body(lines=[[-1, True]]), LINES_PATH) == 400
    assert channel.handle(auth, body(lines=[[1.0, True]] * 4097), LINES_PATH) == 400
    assert channel.handle("Bearer x", body(), LINES_PATH) == 401
    await asyncio.sleep(0)
    assert list(board._routes["r1"].peers) == ["B"]
    assert channel.handle(auth, body(worker="me"), LINES_PATH) == 204  # its own: ignored
    await asyncio.sleep(0)
    assert list(board._routes["r1"].peers) == ["B"]
