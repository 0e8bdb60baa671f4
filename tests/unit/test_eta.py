"""The honest ETA (backfill/batches/eta.py), its fields on a batch read through the api
(api/batches/eta.py), and the exporter's at-risk gauge, without a server."""

from __future__ import annotations

from typing import Any, cast

import openai
from prometheus_client import REGISTRY

from api.batches.eta import PROGRESS, fill_eta
from backfill.batches.batch import BackfillExtension, Batch, RequestCounts, RouteProgress
from backfill.batches.eta import MAX_BATCHES, RECENT_SECONDS, ProgressLog, Sample, estimate
from backfill.platform.config import Settings
from worker.exporter import Exporter


def test_the_rate_is_the_recent_window_not_the_whole_run() -> None:
    log = ProgressLog()
    log.add("b", Sample(0, 0))
    log.add("b", Sample(100, 1000))  # a fast start...
    samples = log.add("b", Sample(100 + RECENT_SECONDS, 1300))  # ...then 1 line/s
    assert samples[0] == Sample(100, 1000)  # the first sample left the window
    est = estimate(samples, total=2300, now=100 + RECENT_SECONDS, in_progress_at=0, expires_at=None)
    assert est.lines_per_second == 1.0
    assert est.expected_finish_at == 100 + RECENT_SECONDS + 1000
    assert not est.at_risk


def test_at_risk_when_the_expected_finish_is_after_expiry() -> None:
    samples = [Sample(1000, 100), Sample(1010, 110)]  # 1 line/s, 890 lines left
    on_time = estimate(samples, total=1000, now=1010, in_progress_at=0, expires_at=1900)
    late = estimate(samples, total=1000, now=1010, in_progress_at=0, expires_at=1899)
    assert on_time.expected_finish_at == 1900 and not on_time.at_risk
    assert late.at_risk


def test_a_first_look_uses_the_average_since_in_progress_and_a_standstill_has_no_finish() -> None:
    first = estimate([Sample(1100, 50)], total=100, now=1100, in_progress_at=1000, expires_at=0)
    assert first.lines_per_second == 0.5 and first.expected_finish_at == 1200 and first.at_risk
    too_soon = estimate([Sample(1002, 5)], total=100, now=1002, in_progress_at=1000, expires_at=0)
    assert too_soon.lines_per_second is None and not too_soon.at_risk
    still = estimate(
        [Sample(0, 5), Sample(60, 5)], total=100, now=60, in_progress_at=0, expires_at=1
    )
    assert still.lines_per_second == 0 and still.expected_finish_at is None and not still.at_risk
    done = estimate(
        [Sample(0, 5), Sample(60, 100)], total=100, now=60, in_progress_at=0, expires_at=1
    )
    assert done.expected_finish_at == 60


def test_the_log_is_bounded_and_counts_going_back_start_over() -> None:
    log = ProgressLog()
    for i in range(MAX_BATCHES + 5):
        log.add(f"b{i}", Sample(0, 0))
    assert len(log.by_batch) == MAX_BATCHES and "b0" not in log.by_batch
    log.add("x", Sample(0, 10))
    assert log.add("x", Sample(10, 3)) == [Sample(10, 3)]


def running_batch(batch_id: str, finished: int, *, expires_at: int) -> Batch:
    return Batch(
        id=batch_id,
        endpoint="/v1/chat/completions",
        input_file_id="file-1",
        completion_window="24h",
        status="in_progress",
        created_at=0,
        in_progress_at=0,
        expires_at=expires_at,
        request_counts=RequestCounts(total=1000, completed=finished),
        backfill=BackfillExtension(
            routes=[
                RouteProgress(
                    model="m",
                    route="rx1",
                    state="running",
                    total_lines=1000,
                    finished_lines=finished,
                )
            ]
        ),
    )


def test_a_read_fills_the_eta_and_the_sdk_still_parses_the_batch() -> None:
    PROGRESS.forget("batch_eta")
    fill_eta(running_batch("batch_eta", 100, expires_at=500), now=1000.0)
    batch = running_batch("batch_eta", 200, expires_at=500)
    fill_eta(batch, now=1100.0)
    assert batch.backfill.lines_per_second == 1.0
    assert batch.backfill.expected_finish_at == 1900 and batch.backfill.at_risk
    parsed = openai.types.Batch.model_validate(batch.model_dump(mode="json"))
    assert parsed.id == "batch_eta"
    ended = batch.model_copy(update={"status": "completed"})
    ended.backfill = BackfillExtension()
    fill_eta(ended, now=1200.0)
    assert ended.backfill.expected_finish_at is None and "batch_eta" not in PROGRESS.by_batch


def test_the_exporter_counts_batches_at_risk_per_route() -> None:
    def at_risk() -> float:
        return REGISTRY.get_sample_value("gateway_batch_at_risk_batches", {"provider": "rx1"}) or 0

    settings = Settings(models=[{"id": "m", "routes": [{"id": "rx1", "base_url": "http://a/v1"}]}])
    exporter = Exporter(cast(Any, None), settings)
    late, fine = "batch_late", "batch_fine"
    exporter._export_at_risk(
        [running_batch(late, 10, expires_at=100), running_batch(fine, 10, expires_at=10**9)], 0
    )
    exporter._export_at_risk(
        [running_batch(late, 20, expires_at=100), running_batch(fine, 20, expires_at=10**9)], 10
    )
    assert at_risk() == 1  # 1 line/s: 980 lines are due long after 100
    exporter._export_at_risk([], 20)
    assert at_risk() == 0 and not exporter.progress.by_batch


def test_a_paused_batch_has_a_pace_but_no_expected_finish() -> None:
    PROGRESS.forget("batch_paused")
    fill_eta(running_batch("batch_paused", 100, expires_at=500), now=1000.0)
    batch = running_batch("batch_paused", 200, expires_at=500)
    batch.backfill.paused = True
    fill_eta(batch, now=1100.0)
    assert batch.backfill.lines_per_second == 1.0
    assert batch.backfill.expected_finish_at is None and not batch.backfill.at_risk
