"""The batch's per-route bookkeeping: what may start, requeues, shrinks, demand reports."""

from __future__ import annotations

from api.routes.routes_api import RouteLines, route_lines
from backfill.batches.batch import Batch
from backfill.batches.lanes import Lane, RouteAssignment, Tries, demand_to_report, pace_to_report
from backfill.batches.lifecycle import show_done, show_progress
from backfill.platform.messages import BatchSlot, SchedulerInput
from backfill.routes.gates import Gate
from backfill.routes.settings import RouteSettings
from workflows.scheduler_view import scheduler_status


def lane(total: int = 10, **kw: object) -> Lane:
    return Lane(index=0, route_id="r", model="m", total=total, **kw)  # type: ignore[arg-type]


def test_lines_start_only_within_the_allotment() -> None:
    ln = lane()
    assert not ln.can_start(0)  # no allotment yet: nothing runs
    ln.set_allotment(1, 2)
    started = []
    while ln.can_start(0):
        started.append(ln.take())
    assert started == [(0, Tries()), (1, Tries())] and ln.running == 2


def test_a_lane_is_built_from_its_route_assignment_with_nothing_run() -> None:
    a = RouteAssignment(index=2, route_id="r9", model="m9", total=7)
    ln = Lane.from_assignment(a)
    assert (ln.index, ln.route_id, ln.model, ln.total) == (2, "r9", "m9", 7)
    assert ln == Lane(index=2, route_id="r9", model="m9", total=7)
    assert ln.pending_count() == 7 and not ln.done


def test_a_finished_line_counts_and_resets_the_back_off_level() -> None:
    ln = lane(total=2)
    ln.set_allotment(1, 2)
    ln.take()
    ln.back_off(0.0)
    ln.back_off(0.0)
    ln.finish()
    assert (ln.finished, ln.backoff_level, ln.done) == (1, 0, False)
    ln.finish()
    assert ln.done


def test_requeued_lines_go_first_with_their_attempts() -> None:
    ln = lane()
    ln.set_allotment(1, 3)
    ln.take()
    ln.take()
    ln.requeue(1, Tries(retries=2, lost=1))
    ln.running -= 1
    assert ln.take() == (1, Tries(retries=2, lost=1))
    assert ln.take() == (2, Tries())


def test_a_preempted_line_goes_first_again_and_its_cost_is_counted() -> None:
    ln = lane()
    ln.set_allotment(1, 2)
    ln.take()
    ln.take()
    ln.requeue_preempted(1, Tries(retries=1), wasted_tokens=120)
    ln.running -= 1
    ln.requeue_preempted(0, Tries(preempted=2), wasted_tokens=30)
    ln.running -= 1
    # No retry counted, no back-off: first in the queue, `Tries.preempted` bounds it.
    assert ln.take() == (0, Tries(preempted=3))
    assert ln.take() == (1, Tries(retries=1, preempted=1))
    assert ln.backoff_until is None and ln.can_start(0) is False  # the allotment of 2 is full
    assert (ln.preempted_lines, ln.wasted_tokens) == (2, 150)
    ln.reprefill_tokens = 40  # what the workflow adds up from its lines' outcomes

    # Shown per route on the batch (kept when it ends), summed per route for the route status.
    other = Lane(index=1, route_id="s", model="m", total=4, preempted_lines=5, wasted_tokens=9)
    b = Batch(
        id="b", endpoint="/v1/chat/completions", input_file_id="f", completion_window="24h",
        status="in_progress", created_at=0,
    )  # fmt: skip
    show_progress(b, [ln, other], ending=False)
    shown = [
        (p.route, p.preempted_lines, p.wasted_tokens, p.reprefill_tokens) for p in b.backfill.routes
    ]
    assert shown == [("r", 2, 150, 40), ("s", 5, 9, 0)]
    show_done(b)
    assert route_lines(b, "r") == RouteLines(
        running=0, preempted=2, wasted_tokens=150, reprefill_tokens=40
    )
    assert route_lines(b, "r") + route_lines(b, "s") == RouteLines(0, 7, 159, 40)


def test_backoff_blocks_starts_until_it_passes_and_doubles() -> None:
    ln = lane()
    ln.set_allotment(1, 2)
    ln.back_off(100.0)
    assert not ln.can_start(100.5) and ln.can_start(101.0)
    ln.back_off(101.0)
    assert ln.backoff_until == 103.0
    for _ in range(20):
        ln.back_off(0.0)
    assert ln.backoff_until == 60.0


def test_a_retry_after_holds_the_lane_that_long_capped_at_an_hour() -> None:
    ln = lane()
    ln.set_allotment(1, 2)
    ln.back_off(100.0, retry_after=3000.0)  # no next line before the upstream said
    assert not ln.can_start(3099.0) and ln.can_start(3100.0)
    ln.back_off(0.0, retry_after=0.5)  # shorter than the doubling: the doubling wins
    assert ln.backoff_until == 2.0
    ln.back_off(0.0, retry_after=86400.0)
    assert ln.backoff_until == 3600.0


def test_stale_allotments_are_ignored_and_shrinks_need_ack() -> None:
    ln = lane()
    ln.set_allotment(2, 4)
    ln.set_allotment(1, 1)  # older epoch arrives late
    assert ln.allotment == 4 and ln.unacked_epoch is None
    ln.set_allotment(3, 2)
    assert ln.allotment == 2 and ln.unacked_epoch == 3
    ln.set_allotment(4, 3)  # a raise while a shrink is unacknowledged: ack the newest
    assert ln.unacked_epoch == 4


def test_allotment_never_exceeds_reported_demand() -> None:
    ln = lane(reported=1)
    ln.set_allotment(1, 4)
    assert ln.allotment == 1


def test_stopped_lane_has_nothing_pending() -> None:
    ln = lane()
    ln.stop()
    assert ln.pending_count() == 0 and not ln.can_start(0)


def test_demand_first_report_rises_and_final_zero() -> None:
    ln = lane(total=100)
    assert demand_to_report(ln, halt=False) == 100
    ln.reported = 100
    ln.allotment = 4
    assert demand_to_report(ln, halt=False) is None  # unchanged
    ln.next_pos, ln.finished = 99, 99
    assert demand_to_report(ln, halt=False) == 1  # below the allotment: worth saying
    ln.reported, ln.allotment = 1, 1
    ln.finished, ln.next_pos = 100, 100
    assert demand_to_report(ln, halt=False) == 0


def test_demand_falls_are_reported_logarithmically() -> None:
    ln = lane(total=0, reported=256, allotment=256)
    reports = 0
    for running in range(255, -1, -1):
        ln.running = running
        wanted = demand_to_report(ln, halt=True)
        if wanted is not None:
            reports += 1
            ln.reported = wanted
            ln.allotment = min(ln.allotment, wanted)
    assert ln.reported == 0
    assert reports <= 25, reports


def test_pause_reports_only_running_lines() -> None:
    ln = lane(total=50, reported=50, allotment=4, running=3, next_pos=3)
    assert demand_to_report(ln, halt=True) == 3


def test_scheduler_status_reasons_and_queue_positions() -> None:
    s = SchedulerInput(route_id="r", settings=RouteSettings(max_concurrent_lines=2))
    s.batches = {
        "a": BatchSlot(batch_id="a", workspace="w1", wanted=10, allotment=2, held=2, arrived=1),
        "b": BatchSlot(batch_id="b", workspace="w2", wanted=5, allotment=0, held=0, arrived=2),
    }
    st = scheduler_status(s, Gate(True), 0.0)
    by_id = {b.batch_id: b for b in st.batches}
    assert by_id["b"].reason == "Other batches' turn" and by_id["b"].queue_position is not None
    assert by_id["a"].reason == "At its batch limit"
    assert st.queued_lines == 8 + 5 and st.held == 2 and st.limit == 2
    assert (st.state, st.reason) == ("open", "At its batch limit")
    closed = scheduler_status(s, Gate(False, "Yielding to live traffic"), 0.0)
    assert (closed.state, closed.reason) == ("paused", "Yielding to live traffic")
    assert {b.reason for b in closed.batches} == {"Yielding to live traffic"}


def test_a_lane_keeps_the_mean_time_of_its_finished_lines() -> None:
    ln = lane()
    assert ln.line_seconds is None
    ln.time_line(10.0)
    ln.time_line(20.0)
    ln.time_line(-1.0)  # a clock that went back counts as 0
    assert (ln.line_seconds, ln.timed_lines) == (10.0, 3)


def test_pace_is_reported_once_known_on_quarter_falls_and_when_the_timed_lines_double() -> None:
    ln = lane(total=100, allotment=2, running=2, next_pos=2, reported=100)
    assert pace_to_report(ln, halt=False) is None  # no line finished yet
    ln.time_line(60.0)
    assert pace_to_report(ln, halt=False) == 100  # first known: the lines not finished
    ln.reported_timed_lines = ln.timed_lines
    assert pace_to_report(ln, halt=False) is None
    # 25 lines finish: 75 left, a quarter fewer than reported, while the allotment is 2
    ln.next_pos, ln.finished = 27, 25
    assert demand_to_report(ln, halt=False) is None  # the fair-share rule says nothing
    assert pace_to_report(ln, halt=False) == 75
    ln.reported = 75
    assert pace_to_report(ln, halt=False) is None
    ln.time_line(100.0)  # two lines timed since one was reported: the mean is made anew
    assert pace_to_report(ln, halt=False) == 75
    ln.reported_timed_lines = ln.timed_lines
    ln.finished, ln.next_pos = 60, 62  # 40 left, but paused: no line may start anyway
    assert pace_to_report(ln, halt=True) is None


def test_whether_the_pace_is_reported_never_depends_on_the_line_times() -> None:
    """The mean is measured in workflow time between activations: a replay on another worker
    must schedule the same reports even if its activations saw other times."""
    for times in ([0.3, 0.3, 0.3], [0.3, 5.0, 0.01], [1e-6, 1e6, 3.0]):
        ln = lane(total=100, allotment=2, running=2, next_pos=10, reported=100)
        ln.finished = 8
        said = []
        for t in times:
            ln.time_line(t)
            said.append(pace_to_report(ln, halt=False))
            if said[-1] is not None:
                ln.reported, ln.reported_timed_lines = said[-1], ln.timed_lines
        assert said == [92, 92, None], times
