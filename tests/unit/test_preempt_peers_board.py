"""Exact preemption across workers (issue 34, item 2): each worker counts the other workers'
lines (`PreemptBoard.peer_lines`) and ends only its own among the youngest route-wide."""

from __future__ import annotations

import asyncio
import json
import time

from activities.preemption.board import REPORT_TTL, PreemptBoard
from backfill.platform.messages import PeerLinesReport
from backfill.preemption.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, sign
from backfill.routes.gates.preempt import PreemptPolicy
from tests.unit.test_preemption import TOKEN, Clock
from worker.preemption.channel import LINES_PATH, PreemptChannel

POLICY = PreemptPolicy(batch_seats=3, max_preemptions=100)


def report_of(board: PreemptBoard, worker: str, route: str = "r1") -> PeerLinesReport:
    """The lines report `board`'s worker sends the others now (`worker.preemption.peers`)."""
    own = board.own_lines(route)
    return PeerLinesReport(
        worker=worker,
        route=route,
        lines=[(line.age, line.preemptible) for line in own],
        started_at=[line.started_at for line in own],
    )


def deliver(board: PreemptBoard, report: PeerLinesReport) -> int:
    """`report` arriving at `board` (what `worker.preemption.channel` hands the loop)."""
    return board.peer_lines(report.route, report.worker, report.lines, report.started_at)


async def sent_line(board: PreemptBoard, clock: Clock, at: float, route: str = "r1") -> object:
    clock.now = at
    ticket = board.enter(route, 0)
    assert await board.door(ticket)
    return ticket


async def test_the_youngest_line_route_wide_is_ended_by_its_own_worker_only() -> None:
    clock_a, clock_b = Clock(), Clock()
    a, b = PreemptBoard(clock_a, wall=clock_a), PreemptBoard(clock_b, wall=clock_b)
    for board in (a, b):
        board.set_policy("r1", POLICY)
    older = await sent_line(a, clock_a, 1000.0)  # A: one line, the oldest
    b1 = await sent_line(b, clock_b, 1001.0)
    b2 = await sent_line(b, clock_b, 1002.0)  # B: two lines, the youngest route-wide
    clock_a.now = clock_b.now = 1003.0
    deliver(a, report_of(b, "B"))
    deliver(b, report_of(a, "A"))
    # One live request needs one of the 3 shared seats: every worker sees 3 lines + 1 live.
    assert a.report("r1", "api", 1) == 0  # its line is not the youngest
    assert b.report("r1", "api", 1) == 1
    assert [t.preempted.is_set() for t in (older, b1, b2)] == [False, False, True]  # type: ignore[attr-defined]
    # B tells A; a second report changes nothing (none twice, never more than needed).
    deliver(a, report_of(b, "B"))
    assert a.report("r1", "api", 1) == 0 and b.report("r1", "api", 1) == 0


class Machine:
    """One worker's clocks: a monotonic one from 0 and a wall clock `offset` seconds off
    the true time `world.now`."""

    def __init__(self, world: Clock, offset: float = 0.0) -> None:
        self.world, self.offset = world, offset

    def monotonic(self) -> float:
        return self.world.now - 1000.0

    def wall(self) -> float:
        return 1.8e9 + self.world.now + self.offset


async def two_workers_two_lines(b_offset: float) -> tuple[Clock, PreemptBoard, PreemptBoard]:
    """Workers A and B, each with one line upstream on a route of 2 shared seats: A's went
    at 1000.00, B's 10 ms later (the scheduler allots lines together, so they start close)."""
    world = Clock()
    ma, mb = Machine(world), Machine(world, b_offset)
    policy = PreemptPolicy(batch_seats=2, max_preemptions=100)
    a = PreemptBoard(ma.monotonic, wall=ma.wall, worker="A")
    b = PreemptBoard(mb.monotonic, wall=mb.wall, worker="B")
    for board in (a, b):
        board.set_policy("r1", policy)
    world.now = 1000.0
    assert await a.door(a.enter("r1", 0))
    world.now = 1000.01
    assert await b.door(b.enter("r1", 0))
    return world, a, b


async def test_a_report_that_takes_longer_to_arrive_than_lines_are_apart_ends_one_line() -> None:
    """Each worker's report reaches the other 50 ms after it was made (a loaded machine: the
    HTTP thread, then the event loop): more than the 10 ms between the two lines. Ranked by
    their age on arrival, each worker took the other's line for the younger one and neither
    ended a line for the live request; ranked by the time each line's own worker tells, both
    see the same youngest line and exactly one is ended, by its worker."""
    world, a, b = await two_workers_two_lines(b_offset=0.0)
    world.now = 1000.5
    from_a, from_b = report_of(a, "A"), report_of(b, "B")
    world.now = 1000.55
    deliver(a, from_b)
    deliver(b, from_a)
    ended = a.report("r1", "api", 1) + b.report("r1", "api", 1)
    assert ended == 1
    assert [t.preempted.is_set() for board in (a, b) for t in board._routes["r1"].tickets] == [
        False,
        True,
    ]


async def test_workers_whose_clocks_disagree_still_end_exactly_one_line() -> None:
    """B's clock is 2 s ahead: by the clocks, B's line looks the younger by 2 s, and both
    workers rank it so (the same numbers everywhere), so one line is ended, not two or none."""
    world, a, b = await two_workers_two_lines(b_offset=2.0)
    world.now = 1000.5
    deliver(a, report_of(b, "B"))
    deliver(b, report_of(a, "A"))
    assert a.report("r1", "api", 1) + b.report("r1", "api", 1) == 1
    # A's clock ahead instead: A's line is the one ended, still one.
    world, a, b = await two_workers_two_lines(b_offset=-2.0)
    world.now = 1000.5
    deliver(a, report_of(b, "B"))
    deliver(b, report_of(a, "A"))
    assert a.report("r1", "api", 1) == 1 and b.report("r1", "api", 1) == 0


async def test_a_report_without_times_is_ranked_by_age_on_arrival() -> None:
    """A worker of 0.2.0 sends ages only: its lines still count, placed by their age."""
    world, a, b = await two_workers_two_lines(b_offset=0.0)
    world.now = 1000.5
    old = report_of(b, "B").model_copy(update={"started_at": None})
    deliver(a, old)
    deliver(b, report_of(a, "A"))
    assert a.report("r1", "api", 1) == 0  # B's line, 10 ms younger, is still the youngest
    assert b.report("r1", "api", 1) == 1


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
    channel = PreemptChannel(board, asyncio.get_running_loop(), TOKEN, ["r1"], worker="me")
    sent = iter(range(1, 100))

    def handle(content: bytes, token: str = TOKEN) -> int:
        headers = sign(token, LINES_PATH, content, time.time() + next(sent) / 1000)
        return channel.handle(
            headers[TIMESTAMP_HEADER], headers[SIGNATURE_HEADER], content, LINES_PATH
        )

    def body(**fields: object) -> bytes:
        return json.dumps({"worker": "B", "route": "r1", "lines": [[1.5, True]], **fields}).encode()

    assert handle(body()) == 204
    assert handle(body(route="nope")) == 400
    assert handle(body(lines=[[-1, True]])) == 400
    assert handle(body(lines=[[1.0, True]] * 4097)) == 400
    assert handle(body(started_at=[1.8e9, 1.8e9])) == 400  # 2 for 1
    assert handle(body(started_at=[-1.0])) == 400
    assert handle(body(started_at=[float("inf")])) == 400
    assert handle(body(), token="x" * 40) == 401
    await asyncio.sleep(0)
    assert list(board._routes["r1"].peers) == ["B"]
    assert handle(body(worker="me")) == 204  # its own: ignored
    await asyncio.sleep(0)
    assert list(board._routes["r1"].peers) == ["B"]
