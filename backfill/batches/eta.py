"""An honest ETA for a running batch: its rate over a recent window, the finish that rate gives,
and whether that finish falls after the batch expires. Pure: the readers (the api on each read,
the worker's exporter on each sample, the client CLI on each poll) keep the samples and pass
`now` in.

The rate is the lines finished (completed or failed) per second between the oldest sample of
the last `RECENT_SECONDS` and now. Until the samples span `MIN_SPAN_SECONDS` (a reader's first
look), it is the average since the batch went in progress. It assumes the recent pace goes on:
a batch that waits (a closed time window, a pause) has no rate, hence no expected finish, until
lines move again.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

RECENT_SECONDS = 300.0
MIN_SPAN_SECONDS = 5.0
MAX_BATCHES = 10_000
"""Batches a `ProgressLog` keeps samples for (the least recently read are forgotten)."""
MAX_SAMPLES = 64
"""Samples kept per batch."""
SPACING_SECONDS = RECENT_SECONDS / (MAX_SAMPLES - 4)
"""The least time between two kept samples (the newest excepted): however often a reader polls,
`MAX_SAMPLES` samples span the whole `RECENT_SECONDS` window."""


@dataclass(frozen=True)
class Sample:
    at: float
    """Unix seconds."""
    finished: int
    """Lines finished (completed + failed) at that time."""


@dataclass(frozen=True)
class Estimate:
    lines_per_second: float | None = None
    expected_finish_at: int | None = None
    """Unix seconds; None while the rate is unknown or zero."""
    at_risk: bool = False
    """The expected finish is after `expires_at`."""


@dataclass
class ProgressLog:
    """Recent progress samples per batch, in memory (each process keeps its own)."""

    by_batch: OrderedDict[str, deque[Sample]] = field(default_factory=OrderedDict)

    def add(self, batch_id: str, sample: Sample) -> list[Sample]:
        """Record a sample; the batch's samples of the last `RECENT_SECONDS`, oldest first."""
        kept = self.by_batch.pop(batch_id, None) or deque(maxlen=MAX_SAMPLES)
        self.by_batch[batch_id] = kept
        while len(self.by_batch) > MAX_BATCHES:
            self.by_batch.popitem(last=False)
        if kept and sample.finished < kept[-1].finished:
            kept.clear()  # counts went back (another run's view): start over
        if not kept or sample.at > kept[-1].at:
            if len(kept) >= 2 and kept[-1].at - kept[-2].at < SPACING_SECONDS:
                kept[-1] = sample  # the newest replaces one too close to the sample before it
            else:
                kept.append(sample)
        while kept and sample.at - kept[0].at > RECENT_SECONDS:
            kept.popleft()
        return list(kept)

    def forget(self, batch_id: str) -> None:
        self.by_batch.pop(batch_id, None)


def estimate(
    samples: list[Sample],
    *,
    total: int,
    now: float,
    in_progress_at: int | None,
    expires_at: int | None,
) -> Estimate:
    """The estimate from `samples` (oldest first, the last one taken at `now`)."""
    if not samples or total <= 0:
        return Estimate()
    first, last = samples[0], samples[-1]
    remaining = max(0, total - last.finished)
    rate: float | None = None
    if last.at - first.at >= MIN_SPAN_SECONDS:
        rate = (last.finished - first.finished) / (last.at - first.at)
    elif in_progress_at is not None and now - in_progress_at >= MIN_SPAN_SECONDS:
        rate = last.finished / (now - in_progress_at)
    if rate is None:
        return Estimate()
    if remaining == 0:
        finish: int | None = int(now)
    elif rate > 0:
        finish = int(now + remaining / rate)
    else:
        finish = None
    at_risk = finish is not None and expires_at is not None and finish > expires_at
    return Estimate(lines_per_second=round(rate, 3), expected_finish_at=finish, at_risk=at_risk)
