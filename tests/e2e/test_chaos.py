"""Reduced-size chaos run in CI (the full 20,000-line run is bench/chaos.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.chaos import run_chaos


@pytest.mark.timeout(1200)
async def test_batch_survives_worker_kills_and_restarts(tmp_path: Path) -> None:
    report = await run_chaos(tmp_path, lines=600)
    assert report.status == "completed", report
    assert report.missing == [] and report.duplicated == [], report
    assert report.completed == 600 and report.failed == 0, report
    # Each kill landed while lines were running at the upstream...
    assert len(report.in_flight_at_kills) == 3 and min(report.in_flight_at_kills) > 0, report
    # ...and those lines were really sent again (yet committed once, above).
    assert report.upstream_requests > 600, report
