"""backfill.batches.lifecycle: every status transition (legal and illegal), expiry, the extension
fields and the next wake-up, without a server."""

from __future__ import annotations

from typing import get_args

import pytest

from backfill.batches.batch import Batch, BatchStatus, RequestCounts, TokenCounts
from backfill.batches.lanes import Lane
from backfill.batches.lifecycle import (
    KEEPALIVE_SECONDS,
    NEXT_STATUSES,
    STAMPS,
    check_expiry,
    end_status,
    initial_batch,
    keepalive_due,
    may_cancel,
    next_wakeup,
    show_done,
    show_progress,
    status_memo,
    tally_line,
    transition,
)
from backfill.platform.messages import BatchInput, LineOutcome

NOW = 1_800_000_000
ALL: tuple[BatchStatus, ...] = get_args(BatchStatus)
LEGAL = [(a, b) for a, nexts in NEXT_STATUSES.items() for b in sorted(nexts)]
ILLEGAL = [(a, b) for a in ALL for b in ALL if b not in NEXT_STATUSES.get(a, frozenset())]


def batch(status: BatchStatus = "validating", **kw: object) -> Batch:
    b = initial_batch(
        BatchInput(
            batch_id="batch_1",
            workspace="w",
            input_file_id="file-1",
            endpoint="/v1/chat/completions",
            completion_window="24h",
            created_at=NOW - 100,
        )
    )
    return b.model_copy(update={"status": status, **kw})


def lane(**kw: object) -> Lane:
    return Lane(index=0, route_id="r", model="m", total=10).model_copy(update=kw)


def test_the_table_is_the_documented_lifecycle() -> None:
    assert set(LEGAL) == {
        ("validating", "in_progress"),
        ("validating", "failed"),
        ("validating", "cancelling"),
        ("in_progress", "finalizing"),
        ("in_progress", "cancelling"),
        ("in_progress", "expired"),
        ("in_progress", "failed"),  # an expired batch's files could not be assembled
        ("cancelling", "cancelled"),
        ("cancelling", "failed"),
        ("cancelling", "expired"),
        ("finalizing", "completed"),
        ("finalizing", "failed"),  # the store stayed unavailable until the deadline
    }


@pytest.mark.parametrize("src,dst", LEGAL)
def test_legal_transition_sets_status_and_its_timestamp(src: BatchStatus, dst: BatchStatus) -> None:
    b = batch(src)
    transition(b, dst, NOW)
    assert b.status == dst
    assert getattr(b, STAMPS[dst]) == NOW
    others = {f for s, f in STAMPS.items() if s != dst}
    assert all(getattr(b, f) is None for f in others)


def test_expired_keeps_the_moment_the_window_ended() -> None:
    b = batch("in_progress", expired_at=NOW - 5)
    transition(b, "expired", NOW)
    assert b.status == "expired" and b.expired_at == NOW - 5


@pytest.mark.parametrize("src,dst", ILLEGAL)
def test_illegal_transition_raises_and_changes_nothing(src: BatchStatus, dst: BatchStatus) -> None:
    b = batch(src)
    before = b.model_copy(deep=True)
    with pytest.raises(ValueError, match=f"cannot go from '{src}' to '{dst}'"):
        transition(b, dst, NOW)
    assert b == before


def test_illegal_transition_says_what_may_follow() -> None:
    with pytest.raises(ValueError, match=r"only to cancelled, expired, failed"):
        transition(batch("cancelling"), "in_progress", NOW)
    with pytest.raises(ValueError, match=r"'completed' is final"):
        transition(batch("completed"), "cancelling", NOW)


@pytest.mark.parametrize("status", ALL)
def test_may_cancel_only_before_the_files_are_assembled(status: BatchStatus) -> None:
    assert may_cancel(batch(status)) == (status in ("validating", "in_progress"))


def test_end_status() -> None:
    assert [end_status(r) for r in ("completed", "expired", "cancelled")] == [
        "completed",
        "expired",
        "cancelled",
    ]


def test_initial_batch() -> None:
    b = batch()
    assert b.status == "validating" and b.created_at == NOW - 100
    assert b.expires_at == NOW - 100 + 24 * 3600 and b.backfill.workspace == "w"


def test_check_expiry_stops_lanes_at_expires_at_exactly() -> None:
    b, lanes = batch("in_progress"), [lane(), lane(index=1)]
    assert b.expires_at is not None
    check_expiry(b, lanes, b.expires_at - 1)
    assert b.expired_at is None and not any(x.stopped for x in lanes)
    check_expiry(b, lanes, b.expires_at)
    assert b.expired_at == b.expires_at and all(x.stopped for x in lanes)
    check_expiry(b, lanes, b.expires_at + 50)
    assert b.expired_at == b.expires_at  # set once


def test_a_cancelling_batch_does_not_expire() -> None:
    b, lanes = batch("cancelling"), [lane()]
    check_expiry(b, lanes, NOW + 10 * 86400)
    assert b.expired_at is None and not lanes[0].stopped


def test_show_progress_and_summary() -> None:
    b = batch("in_progress")
    lanes = [lane(next_pos=3, finished=2, running=1, allotment=1)]
    show_progress(b, lanes, ending=False)
    (p,) = b.backfill.routes
    assert (p.state, p.running_lines, p.allotment, p.total_lines, p.finished_lines) == (
        "running",
        1,
        1,
        10,
        2,
    )
    assert b.backfill.summary is None
    show_progress(b, [lane(next_pos=3, finished=3)], ending=False)
    assert b.backfill.summary == "Queued — waiting for capacity"
    show_progress(b, [lane(next_pos=3, finished=3)], ending=True)
    assert b.backfill.summary is None
    b.backfill.paused = True
    show_progress(b, lanes, ending=False)
    assert b.backfill.summary == "Paused" and b.backfill.routes[0].state == "paused"
    show_done(b)
    assert b.backfill.summary is None
    assert [(r.state, r.running_lines, r.allotment) for r in b.backfill.routes] == [("done", 0, 0)]


def test_keepalive_only_for_demand_waiting_for_an_allotment() -> None:
    waiting = lane(reported=10, reported_at=100.0)
    assert keepalive_due(waiting, quiet=False) == 100.0 + KEEPALIVE_SECONDS
    assert keepalive_due(waiting, quiet=True) is None
    assert keepalive_due(lane(reported=10, reported_at=100.0, allotment=1), quiet=False) is None
    assert keepalive_due(lane(reported_at=None), quiet=False) is None
    assert keepalive_due(lane(next_pos=10, reported_at=100.0), quiet=False) is None


def test_next_wakeup_is_the_earliest_deadline() -> None:
    expires = NOW + 3600
    assert next_wakeup([lane()], expires_at=expires, ending=False, quiet=False) == expires
    assert next_wakeup([lane()], expires_at=expires, ending=True, quiet=False) is None
    backoff = lane(backoff_until=float(NOW + 5))
    assert next_wakeup([backoff], expires_at=expires, ending=False, quiet=False) == NOW + 5
    keep = lane(reported=10, reported_at=float(NOW))
    assert (
        next_wakeup([keep], expires_at=NOW + 86400, ending=False, quiet=False)
        == NOW + KEEPALIVE_SECONDS
    )
    assert next_wakeup([keep], expires_at=NOW + 86400, ending=False, quiet=True) == NOW + 86400


def test_current_details_show_summary_status_progress_and_routes() -> None:
    from backfill.batches.batch import RouteProgress
    from backfill.batches.lifecycle import current_details

    b = initial_batch(
        BatchInput(
            batch_id="b1",
            workspace="ws",
            input_file_id="f",
            endpoint="/v1/chat/completions",
            completion_window="24h",
            created_at=0,
        )
    )
    b.status = "in_progress"
    b.backfill.paused, b.backfill.paused_by = True, "ops-key"
    b.backfill.routes = [
        RouteProgress(
            model="m",
            route="r1",
            state="paused",
            running_lines=1,
            allotment=2,
            total_lines=10,
            finished_lines=4,
        )
    ]
    text = current_details(b, "a summary")
    assert text.splitlines() == [
        "a summary",
        "**in_progress** · paused by ops-key · 4/10 lines finished",
        "- r1 (m): paused, 1 running (allotment 2), 4/10",
    ]
    assert current_details(b, None).startswith("**in_progress**")


def test_the_status_memo_holds_status_counts_and_times_and_nothing_large() -> None:
    b = batch(
        "in_progress",
        in_progress_at=NOW,
        request_counts=RequestCounts(total=30, completed=4, failed=1),
        metadata={f"k{i}": "v" * 512 for i in range(16)},
    )
    memo = status_memo(b)
    assert memo["status"] == "in_progress" and memo["in_progress_at"] == NOW
    assert memo["request_counts"] == {"total": 30, "completed": 4, "failed": 1}
    assert "metadata" not in memo and "backfill" not in memo and "errors" not in memo
    assert Batch.model_validate({**b.model_dump(), **memo}) == b


def test_a_back_off_wakes_a_batch_only_while_lines_may_start() -> None:
    backoff = lane(backoff_until=float(NOW + 5))
    expires = NOW + 3600
    for quiet in (False, True):  # the rule before `alarms-on-time`: always
        assert next_wakeup([backoff], expires_at=expires, ending=False, quiet=quiet) == NOW + 5
    assert (
        next_wakeup(
            [backoff], expires_at=expires, ending=False, quiet=False, backoffs_when_quiet=False
        )
        == NOW + 5
    )
    assert (
        next_wakeup(
            [backoff], expires_at=expires, ending=False, quiet=True, backoffs_when_quiet=False
        )
        == expires
    )


def test_tally_line_counts_each_outcome_and_its_usage() -> None:
    b = batch("in_progress", request_counts=RequestCounts(total=3))
    tally_line(b, LineOutcome(line=0, ok=True, usage=TokenCounts(input_tokens=3, total_tokens=7)))
    tally_line(b, LineOutcome(line=1, error_code="http_400"))
    tally_line(b, LineOutcome(line=2, error_code="line_lost"))
    assert (b.request_counts.completed, b.request_counts.failed) == (1, 2)
    assert (b.usage.input_tokens, b.usage.total_tokens) == (3, 7)
