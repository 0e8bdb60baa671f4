"""The stall clock (worker/stall.py) and the route reason the exporter counts, without a server."""

from __future__ import annotations

from backfill.batches.batch import BackfillExtension, Batch, RouteProgress
from backfill.platform.metrics import outcome_class
from backfill.routes.reasons import WaitReason
from backfill.routes.settings import RouteSettings
from backfill.routes.status import BatchStatusEntry, SchedulerStatus
from worker.exporter import route_reason
from worker.stall import StallClock, advance, waits_legitimately


def batch(*routes: RouteProgress, paused: bool = False, status: str = "in_progress") -> Batch:
    return Batch(
        id="batch_1",
        endpoint="/v1/chat/completions",
        input_file_id="file-1",
        completion_window="24h",
        status=status,  # type: ignore[arg-type]
        created_at=0,
        backfill=BackfillExtension(paused=paused, routes=list(routes), workspace="ws"),
    )


def route(
    state: str = "queued",
    reason: str | None = None,
    running: int = 0,
    total: int = 10,
    finished: int = 0,
    name: str = "r1",
) -> RouteProgress:
    return RouteProgress(
        model="m",
        route=name,
        state=state,
        reason=reason,
        running_lines=running,
        total_lines=total,
        finished_lines=finished,
    )


def test_a_batch_with_hung_running_lines_accumulates_stall_time() -> None:
    b = batch(route("running", reason=WaitReason.AT_LIMIT, running=2))
    clock = advance(None, b, now=100.0)
    assert clock == StallClock(finished=0, stalled=0.0, at=100.0)
    clock = advance(clock, b, now=110.0)
    clock = advance(clock, b, now=125.0)
    assert clock is not None and clock.stalled == 25.0


def test_a_finished_line_resets_the_clock() -> None:
    clock = StallClock(finished=3, stalled=500.0, at=100.0)
    after = advance(clock, batch(route("running", running=1, finished=4)), now=110.0)
    assert after == StallClock(finished=4, stalled=0.0, at=110.0)


def test_every_legitimate_reason_stops_the_clock_and_metrics_unavailable_does_not() -> None:
    for reason in (
        WaitReason.WINDOW,
        WaitReason.LIVE,
        WaitReason.BUSY,
        WaitReason.AT_LIMIT,
        WaitReason.OTHERS_TURN,
        WaitReason.BACKOFF,
        WaitReason.MAINTENANCE,
    ):
        b = batch(route("queued", reason=reason))
        assert waits_legitimately(b), reason
        assert advance(StallClock(0, 7.0, 100.0), b, now=160.0) == StallClock(0, 7.0, 160.0)
    b = batch(route("queued", reason=WaitReason.METRICS))
    assert not waits_legitimately(b)
    assert advance(StallClock(0, 7.0, 100.0), b, now=160.0) == StallClock(0, 67.0, 160.0)


def test_no_reason_paused_and_workers_busy() -> None:
    assert not waits_legitimately(batch(route("queued", reason=None)))
    assert waits_legitimately(batch(route("paused"), paused=True))
    # Allotted lines that no worker slot picks up: waiting for workers, not stuck upstream.
    assert waits_legitimately(batch(route("running", reason=WaitReason.WORKERS_BUSY, running=2)))


def test_every_open_route_must_wait_legitimately() -> None:
    b = batch(
        route("queued", reason=WaitReason.WINDOW, name="r1"),
        route("queued", reason=WaitReason.METRICS, name="r2"),
        route("done", total=5, finished=5, name="r3"),
    )
    assert not waits_legitimately(b)
    b = batch(
        route("queued", reason=WaitReason.WINDOW, name="r1"),
        route("done", total=5, finished=5, name="r3"),
    )
    assert waits_legitimately(b)


def test_no_lines_left_or_not_in_progress_has_no_clock() -> None:
    assert advance(None, batch(route("done", total=3, finished=3)), now=1.0) is None
    assert advance(StallClock(0, 9.0, 0.0), batch(route(), status="finalizing"), now=1.0) is None


def status(state: str = "open", reason: str | None = None, queued: int = 0) -> SchedulerStatus:
    return SchedulerStatus(
        route_id="r1",
        settings=RouteSettings(max_concurrent_lines=2),
        limit=2,
        allotted=2,
        held=2,
        queued_lines=queued,
        batches=[BatchStatusEntry(batch_id="b", workspace="w", wanted=4, allotment=2, held=2)],
        state=state,  # type: ignore[arg-type]
        reason=reason,
    )


def test_route_reason_prefers_a_closed_gate_then_workers_busy_then_the_cap() -> None:
    busy = batch(route("running", reason=WaitReason.WORKERS_BUSY, running=2))
    assert route_reason(status("paused", WaitReason.LIVE), [busy]) == WaitReason.LIVE
    assert route_reason(status("open", WaitReason.AT_LIMIT, 3), [busy]) == (WaitReason.WORKERS_BUSY)
    assert route_reason(status("open", WaitReason.AT_LIMIT, 3), []) == WaitReason.AT_LIMIT
    assert route_reason(status("open", WaitReason.AT_LIMIT, 0), []) is None
    assert route_reason(None, []) is None


def test_outcome_classes() -> None:
    assert outcome_class(200, True) == "2xx"
    assert outcome_class(404, False) == "4xx"
    assert outcome_class(500, False) == "5xx"
    assert outcome_class(None, False) == "error"


def test_scheduler_details_name_the_reason_and_each_batchs_place() -> None:
    from workflows.scheduler_view import scheduler_details

    st = status("paused", WaitReason.LIVE, 2)
    st.batches[0].reason, st.batches[0].queue_position = WaitReason.LIVE, 1
    assert scheduler_details(st).splitlines() == [
        "**paused** · Yielding to live traffic",
        "limit 2 · allotted 2 · queued lines 2 · live in flight 0",
        "- b (w): allotment 2 of 4 wanted · Yielding to live traffic · place 1",
    ]


def test_the_exporter_counts_routes_per_reason_and_changes_into_a_reason() -> None:
    from typing import Any, cast

    from prometheus_client import REGISTRY

    from backfill.platform.config import Settings
    from worker.exporter import Exporter

    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    settings = Settings(models=[{"id": "m", "routes": [{"id": "rx1", "base_url": "http://a/v1"}]}])
    exporter = Exporter(cast(Any, None), settings)
    live = WaitReason.LIVE
    before = sample("gateway_batch_route_pauses_total", reason=live)
    running = batch(route("running", running=2, name="rx1"))
    st = status("paused", live, 3)
    st.route_id = "rx1"
    exporter._export_routes({"rx1": st}, [running])  # first sample: a state, not a change
    assert sample("gateway_batch_paused_routes", reason=live) == 1
    assert sample("gateway_batch_route_lines", provider="rx1", state="waiting") == 3
    assert sample("gateway_batch_route_lines", provider="rx1", state="running") == 2
    assert sample("gateway_batch_route_pauses_total", reason=live) == before
    exporter._export_routes({"rx1": None}, [])  # the scheduler is gone: no reason
    assert sample("gateway_batch_paused_routes", reason=live) == 0
    exporter._export_routes({"rx1": st}, [running])
    assert sample("gateway_batch_route_pauses_total", reason=live) == before + 1


def test_the_reasons_keep_their_exact_text_and_only_metrics_unavailable_is_not_legitimate() -> None:
    # The values are in saved histories, the API and metric labels: never reworded.
    assert [str(r) for r in WaitReason] == [
        "Outside its time window",
        "Yielding to live traffic",
        "Server busy",
        "Server metrics unavailable",
        "At its batch limit",
        "Other batches' turn",
        "Gateway batch workers busy",
        "Rate limited · backing off",
        "Keeping seats free for live traffic",
        "Ramping up after a reopen",
        "Held for maintenance",
    ]
    assert [r for r in WaitReason if not r.legitimate] == [WaitReason.METRICS]
