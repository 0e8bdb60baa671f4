"""Preemptive yield: the pure decision (`backfill.routes.gates.preempt`), a worker's board
(`activities.preemption.board`), the line activity ending its upstream request without committing
(exactly once per custom_id), and the worker's channel endpoint."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from prometheus_client import REGISTRY
from temporalio.testing import ActivityEnvironment

from activities.lines.run_line import LineActivities
from activities.preemption.board import ADJUST_EVERY, REPORT_TTL, PreemptBoard
from api.live.reporter import should_report
from backfill.platform.messages import LineOutcome
from backfill.preemption.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, sign
from backfill.routes.gates import seats as seats_gate
from backfill.routes.gates.base import GateContext
from backfill.routes.gates.preempt import (
    Preempt,
    PreemptPolicy,
    excess,
    held_back,
    lines_to_preempt,
    may_send,
)
from backfill.routes.gates.preempt import policy as preempt_policy
from backfill.routes.gates.seats import SeatAware
from backfill.routes.settings import RouteSettings
from tests.unit.test_run_line import BATCH, OK_BODY, line, make, record
from worker.preemption.channel import PATH, PreemptChannel

TOKEN = "t" * 32
"""A channel token of the shortest length accepted."""

POLICY = PreemptPolicy(batch_seats=4, max_preemptions=2)


def report(
    board: PreemptBoard,
    route: str,
    process: str,
    live: int,
    policy: PreemptPolicy | None,
    ttft_ms: float | None = None,
) -> int:
    """The route's policy as its scheduler holds it (`set_policy`) and one api process's
    report; the lines told to stop by both."""
    return board.set_policy(route, policy) + board.report(route, process, live, ttft_ms)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_youngest_preemptible_lines_are_chosen() -> None:
    started = [1.0, 5.0, 3.0, 4.0]
    assert lines_to_preempt(started, [True] * 4, 2) == [1, 3]
    assert lines_to_preempt(started, [True, False, True, True], 2) == [3, 2]
    assert lines_to_preempt(started, [True] * 4, 0) == []
    assert lines_to_preempt(started, [False] * 4, 3) == []


def test_excess_and_the_door_share_the_seats_of_seat_aware_admission() -> None:
    # 6 seats, 2 kept free: live and batch lines share 4.
    p = preempt_policy(SeatAware(seats=6, keep_free=2), Preempt(max_preemptions=2))
    assert p == POLICY
    assert excess(p, live=1, batch_sending=3) == 0
    assert excess(p, live=3, batch_sending=3) == 2
    assert may_send(p, live=1, batch_sending=2) and not may_send(p, live=2, batch_sending=2)
    assert preempt_policy(None, Preempt()) is None  # it needs seat-aware admission's seats
    assert preempt_policy(SeatAware(seats=6), None) is None


def test_the_setting_is_off_by_default_and_validated() -> None:
    assert RouteSettings().model_dump()["preempt"] is None
    s = RouteSettings.model_validate({"preempt": {"max_preemptions": 3}})
    expected = {"max_preemptions": 3, "live_ttft_target_ms": None, "resume": True}
    assert s.model_dump()["preempt"] == expected
    with pytest.raises(ValueError, match="max_preemptions"):
        RouteSettings.model_validate({"preempt": {"max_preemptions": 0}})


async def test_a_live_count_over_the_shared_seats_stops_the_youngest_lines() -> None:
    clock = Clock()
    board = PreemptBoard(clock)
    tickets = []
    for i, preemptions in enumerate([0, 0, 2, 0]):  # the third was preempted twice already
        clock.now = 1000.0 + i
        t = board.enter("r1", preemptions)
        await board.door(t)  # no report yet: preemption is off, the door is open
        tickets.append(t)
    assert report(board, "r1", "api-a", 0, POLICY) == 0  # 4 lines, 0 live: fits in 4
    assert report(board, "r1", "api-a", 1, POLICY) == 1
    assert [t.preempted.is_set() for t in tickets] == [False, False, False, True]
    board.leave(tickets[3])
    # Two api processes' counts add up; the line preempted twice runs to its end.
    assert report(board, "r1", "api-b", 2, POLICY) == 2
    assert [t.preempted.is_set() for t in tickets[:3]] == [True, True, False]
    # Preemption off (the route's policy None): nothing more is stopped.
    other = board.enter("r2", 0)
    await board.door(other)
    assert report(board, "r2", "api-a", 50, None) == 0 and not other.preempted.is_set()


async def test_a_line_waits_at_the_door_while_no_seat_is_free_and_reports_expire() -> None:
    clock = Clock()
    board = PreemptBoard(clock)
    report(board, "r1", "api-a", 4, POLICY)  # live fills the 4 shared seats
    t = board.enter("r1", 0)
    door = asyncio.ensure_future(board.door(t))
    await asyncio.sleep(0.01)
    assert not door.done() and t.sent_at is None
    report(board, "r1", "api-a", 3, POLICY)  # one seat free
    await asyncio.wait_for(door, 1)
    assert t.sent_at == clock.now
    # An api process that stops renewing its count stops holding seats.
    report(board, "r1", "api-a", 4, POLICY)
    clock.now += REPORT_TTL
    assert board.policy("r1") is None
    await asyncio.wait_for(board.door(board.enter("r1", 0)), 1)


def test_seats_are_held_back_while_the_live_ttft_is_over_the_target() -> None:
    # Over the target: doubled (at least one more); well under it, or nothing measured: one
    # fewer; between 70 % and 100 % of it: kept. Never below 0 or above the shared seats.
    assert [held_back(h, 500.0, 400, 12) for h in (0, 1, 3, 8)] == [1, 2, 6, 12]
    assert [held_back(h, 250.0, 400, 12) for h in (0, 1, 5)] == [0, 0, 4]
    assert held_back(5, None, 400, 12) == 4
    assert held_back(5, 350.0, 400, 12) == 5
    assert held_back(20, 350.0, 400, 12) == 12


async def test_a_live_ttft_target_narrows_the_door_and_preempts_to_keep_it() -> None:
    clock = Clock()
    board = PreemptBoard(clock)
    target = PreemptPolicy(batch_seats=4, max_preemptions=100, ttft_target_ms=400)
    tickets = []
    for i in range(4):
        clock.now = 1000.0 + i
        t = board.enter("r1", 0)
        await board.door(t)
        tickets.append(t)
    assert report(board, "r1", "api-a", 0, target, ttft_ms=300.0) == 0  # within: nothing held
    assert board.held_back("r1") == 0
    # The live TTFT goes over the target: one seat held back, then two (once a second).
    clock.now += ADJUST_EVERY
    assert report(board, "r1", "api-a", 0, target, ttft_ms=900.0) == 1
    assert report(board, "r1", "api-a", 0, target, ttft_ms=900.0) == 0  # not within the second
    clock.now += ADJUST_EVERY
    assert report(board, "r1", "api-a", 0, target, ttft_ms=900.0) == 1
    assert board.held_back("r1") == 2
    assert [t.preempted.is_set() for t in tickets] == [False, False, True, True]
    for t in tickets[2:]:
        board.leave(t)
    # A line at the door waits while the held-back seats are the only free ones.
    waiting = board.enter("r1", 0)
    door = asyncio.ensure_future(board.door(waiting))
    await asyncio.sleep(0.01)
    assert not door.done()
    # Well under the target: a seat is given back each second, and the door opens.
    clock.now += REPORT_TTL  # api-a's 900 ms expires with its report
    report(board, "r1", "api-b", 0, target, ttft_ms=100.0)
    assert board.held_back("r1") == 1
    await asyncio.wait_for(door, 1)
    # Without a target nothing is held back.
    report(board, "r1", "api-b", 0, POLICY, ttft_ms=5000.0)
    assert board.held_back("r1") == 0


def test_seat_aware_admission_reports_every_change() -> None:
    common = {"others": 0, "processes": 1, "threshold": None, "since_sent": 0.0}
    assert not should_report(current=3, held=None, **common)  # no gate reads live counts
    assert should_report(current=3, held=None, every_change=True, **common)
    assert should_report(current=2, held=3, every_change=True, **common)
    assert not should_report(current=3, held=3, every_change=True, **common)
    keepalive = {**common, "since_sent": 10.0}
    assert should_report(current=3, held=3, every_change=True, **keepalive)


# ---- the line activity ----


def hanging_upstream() -> tuple[httpx.MockTransport, asyncio.Event, list[str]]:
    """An upstream that answers only when `release` is set; `seen` records each request's end."""
    release = asyncio.Event()
    seen: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        seen.append("sent")
        try:
            await release.wait()
        except asyncio.CancelledError:
            seen.append("closed")  # the gateway closed the request: the server aborts it
            raise
        return httpx.Response(200, json=OK_BODY)

    return httpx.MockTransport(handler), release, seen


async def preemptible(
    tmp_path: Path, transport: httpx.MockTransport, board: PreemptBoard | None = None
) -> tuple[LineActivities, str]:
    """`make`'s activities (it validates with asyncio.run: in a thread), with a board."""
    acts, file_id, store = await asyncio.to_thread(make, tmp_path, lambda r: httpx.Response(500))
    board = board or PreemptBoard()
    acts = LineActivities(acts.settings, store, httpx.AsyncClient(transport=transport), None, board)
    return acts, file_id


def counter(name: str) -> float:
    return REGISTRY.get_sample_value(name, {"route": "r1"}) or 0.0


async def until_sending(acts: LineActivities) -> None:
    assert acts.preempt is not None
    for _ in range(500):
        r = acts.preempt._routes.get("r1")
        if r is not None and any(t.sent_at is not None for t in r.tickets):
            return
        await asyncio.sleep(0.002)
    raise AssertionError("the line never went upstream")


async def test_a_preempted_line_closes_its_request_and_commits_nothing(tmp_path: Path) -> None:
    transport, release, seen = hanging_upstream()
    clock = Clock()
    acts, file_id = await preemptible(tmp_path, transport, PreemptBoard(clock))
    assert acts.preempt is not None
    # A line completed on this worker taught it the route's pace: 100 tokens in 2 s.
    taught = acts.preempt.enter("r1", 0)
    await acts.preempt.door(taught)
    clock.now += 2
    acts.preempt.finished(taught, 100)
    acts.preempt.leave(taught)
    before = counter("gateway_batch_preempted_lines_total")
    wasted_before = counter("gateway_batch_wasted_tokens_total")
    inp = line(file_id, final=False).model_copy(update={"timeout_seconds": 30})
    running = asyncio.ensure_future(ActivityEnvironment().run(acts.run_line, inp))
    await until_sending(acts)
    clock.now += 3  # 3 s upstream at 50 tokens per second
    report(acts.preempt, "r1", "api-a", 4, POLICY)  # live fills every shared seat
    outcome: LineOutcome = await asyncio.wait_for(running, 5)
    assert outcome.preempted and not outcome.ok and not outcome.retry
    assert outcome.wasted_tokens == 150  # for the batch to count (`backfill.routes[]`)
    assert seen == ["sent", "closed"]
    assert acts.store.get_result(BATCH, 0) is None  # nothing committed
    assert counter("gateway_batch_preempted_lines_total") == before + 1
    assert counter("gateway_batch_wasted_tokens_total") == wasted_before + 150
    # Live traffic leaves; the line runs again (as the workflow requeues it) and is committed.
    report(acts.preempt, "r1", "api-a", 0, POLICY)
    release.set()
    again = await ActivityEnvironment().run(
        acts.run_line, inp.model_copy(update={"preemptions": 1})
    )
    assert again.ok and not again.preempted
    assert record(acts.store)["custom_id"] == "c0"


async def test_a_line_preempted_max_times_runs_to_its_end(tmp_path: Path) -> None:
    transport, release, seen = hanging_upstream()
    acts, file_id = await preemptible(tmp_path, transport)
    assert acts.preempt is not None
    inp = line(file_id).model_copy(update={"timeout_seconds": 30, "preemptions": 2})
    running = asyncio.ensure_future(ActivityEnvironment().run(acts.run_line, inp))
    await until_sending(acts)
    assert report(acts.preempt, "r1", "api-a", 4, POLICY) == 0
    release.set()
    outcome = await asyncio.wait_for(running, 5)
    assert outcome.ok and seen == ["sent"]


async def test_a_preemption_as_the_line_commits_changes_nothing(tmp_path: Path) -> None:
    """First writer wins: a line whose answer is in is committed even if live traffic needs its
    seat at that moment, exactly once; a preempted re-run of a committed line commits nothing."""
    acts, file_id = await preemptible(
        tmp_path, httpx.MockTransport(lambda r: httpx.Response(200, json=OK_BODY))
    )
    board = acts.preempt
    assert board is not None
    commit = acts.store.commit_result

    def commit_while_preempted(batch_id: str, line_no: int, data: bytes):  # type: ignore[no-untyped-def]
        report(board, "r1", "api-a", 4, POLICY)  # arrives as the record is written
        return commit(batch_id, line_no, data)

    acts.store.commit_result = commit_while_preempted  # type: ignore[method-assign]
    outcome = await ActivityEnvironment().run(acts.run_line, line(file_id))
    assert outcome.ok and not outcome.preempted
    first = acts.store.get_result(BATCH, 0)
    # The same line run again (its earlier run's worker was thought lost): the record stands.
    report(board, "r1", "api-a", 0, POLICY)
    again = await ActivityEnvironment().run(acts.run_line, line(file_id))
    assert again.ok and acts.store.get_result(BATCH, 0) == first
    assert json.loads(first or b"{}")["custom_id"] == "c0"


# ---- the worker's channel ----


async def test_the_channel_needs_the_token_and_a_valid_report() -> None:
    board = PreemptBoard()
    board.set_policy("r1", POLICY)  # as the route's scheduler holds it
    channel = PreemptChannel(board, asyncio.get_running_loop(), TOKEN, ["r1"])
    body = json.dumps({"route": "r1", "process": "api-a", "live": 2}).encode()

    def handle(token: str | None, content: bytes) -> int:
        headers = sign(token, PATH, content) if token else {}
        return channel.handle(headers.get(TIMESTAMP_HEADER), headers.get(SIGNATURE_HEADER), content)

    assert handle(None, body) == 401
    assert handle("w" * 40, body) == 401
    assert handle(TOKEN, b'{"route": "r1"}') == 400
    assert handle(TOKEN, body) == 204
    await asyncio.sleep(0)  # handed to the loop
    assert board.policy("r1") == POLICY


EXAMPLE = Path(__file__).parents[2] / "deploy/examples/batch-scheduling/bursty-vllm.json"


def test_the_shipped_bursty_vllm_example_is_a_valid_settings_document() -> None:
    s = RouteSettings.model_validate_json(EXAMPLE.read_text())
    doc = s.model_dump()
    assert (
        doc["preempt"] is not None and doc["seat_aware"]["keep_free"] < doc["seat_aware"]["seats"]
    )


@pytest.mark.parametrize("seats", [16, 32, 128])
def test_changing_only_the_examples_seats_is_enough(seats: int) -> None:
    """Operators (and independent checks) copy the example changing only the URLs and the seats:
    its "Batch lines at once" must not cap a bigger server's seat-aware allotment (a cap of 14,
    sized for 16 seats, held a 32-seat server's batch to 68 % of the spare where the ideal
    client filled 85 %)."""
    doc = json.loads(EXAMPLE.read_text())
    doc["seat_aware"]["seats"] = seats
    s = RouteSettings.model_validate(doc)
    assert s.seat_aware is not None
    idle = GateContext(now=datetime.fromtimestamp(1e9, UTC), cap=s.max_concurrent_lines)
    answer = seats_gate.decide(s.seat_aware, idle)
    assert answer.open and answer.limit == seats - s.seat_aware.keep_free
