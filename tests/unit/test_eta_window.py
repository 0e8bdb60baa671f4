"""The pace is over the last 5 minutes however often the batch is read (issue 39: the window
was the last 64 reads, about half a minute when the CLI polls every 0.5 s)."""

from __future__ import annotations

import pytest

from backfill.batches.eta import RECENT_SECONDS, ProgressLog, Sample, estimate


@pytest.mark.parametrize("every", [0.2, 0.5, 1.0, 5.0, 30.0])
def test_the_window_is_five_minutes_whatever_the_polling(every: float) -> None:
    log = ProgressLog()
    # 10 lines/s for ten minutes, then 1 line/s for the last five.
    t, done, samples = 0.0, 0.0, []
    while t <= 900:
        samples = log.add("b", Sample(t, int(done)))
        done += (10 if t < 600 else 1) * every
        t += every
    now = samples[-1].at
    assert now - samples[0].at >= RECENT_SECONDS - 10, (samples[0], now)
    assert now - samples[0].at <= RECENT_SECONDS
    est = estimate(samples, total=100_000, now=now, in_progress_at=0, expires_at=None)
    assert est.lines_per_second is not None
    assert est.lines_per_second == pytest.approx(1.0, rel=0.2)


def test_the_newest_read_is_always_the_last_sample() -> None:
    log = ProgressLog()
    for i in range(1000):
        samples = log.add("b", Sample(i * 0.1, i))
    assert samples[-1] == Sample(999 * 0.1, 999)
