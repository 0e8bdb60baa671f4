"""The spare-capacity benchmark's workload: the simulated GPU and the live traffic replayed on it.

Live traffic is open loop: streaming chat requests arriving as a Poisson process whose rate
follows a trace, piecewise constant over `Segment`s, seeded so that every mode of a repetition
replays the same arrivals. Four traces, each scaled to the run's `duration_s`; the first three
have the same mean arrival rate (so the same mean live load, and the same spare capacity on
average):

- `bursty`: `cycles` times a quiet phase (`quiet_fill` of the seats busy) then a busy one
  (`busy_fill`: the live load alone nearly fills the server), each `duration_s / (2 × cycles)`;
- `steady`: one constant rate, the bursty trace's mean;
- `step`: a rate for the first half of the run, twice it for the second half;
- `comfortable`: the bursty shape at `COMFORTABLE_FILLS` (10 % and 40 % of the seats) on a
  server stepping twice as fast (`COMFORTABLE_STEP`): live traffic alone is served well (TTFT
  p99 under 100 ms), so what the batch costs it shows.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Literal, get_args

from tools.sim import GpuConfig, SimConfig
from tools.sim.gpu import GpuEngine

Trace = Literal["bursty", "steady", "step", "comfortable"]
TRACES: tuple[str, ...] = get_args(Trace)
COMFORTABLE_FILLS = (0.1, 0.4)
"""The comfortable trace's quiet and busy fills: the bursty shape at a load live traffic alone
serves well (its TTFT p99 under 100 ms on the default 16-seat server), where any cost the batch
adds shows (issue 34, item 6)."""
COMFORTABLE_STEP = 0.5
"""The comfortable trace's server steps this much faster (a smaller model, a faster GPU): with
the default 40 ms steps a live request's first token alone takes one to two steps."""


@dataclass(frozen=True)
class Segment:
    """A stretch of the run at one arrival rate."""

    start_s: float
    end_s: float
    rate: float
    """Live arrivals per second."""
    phase: str
    """Its name in the results: quiet/busy (bursty), steady, low/high (step)."""


@dataclass(frozen=True)
class Arrival:
    at_s: float
    prompt_words: int
    output_tokens: int
    phase: str = "steady"
    """The segment it arrives in."""


@dataclass
class Workload:
    """The simulated GPU and the traffic replayed against it."""

    max_num_seqs: int = 16
    step_base_ms: float = 40.0
    step_per_seq_ms: float = 2.5
    prefill_per_token_ms: float = 0.05
    kv_cache_tokens: int = 65536
    live_prompt_words: tuple[int, int] = (40, 160)
    live_output_tokens: tuple[int, int] = (24, 72)
    batch_prompt_words: int = 100
    batch_output_tokens: int = 128
    trace: Trace = "bursty"
    duration_s: float = 120.0
    """How long live traffic arrives in each run (the measurement window)."""
    cycles: int = 4
    """Quiet/busy cycles of the bursty trace (at 120 s: phases of 15 s)."""
    quiet_fill: float = 0.15
    """Live sequences running in a quiet phase, as a fraction of `max_num_seqs` (offered load)."""
    busy_fill: float = 0.85
    """The same in a busy phase: the live load alone nearly fills the server."""
    seed: int = 1

    def __post_init__(self) -> None:
        if self.trace not in TRACES:
            raise ValueError(f"trace must be one of {', '.join(TRACES)}, not {self.trace!r}")
        if self.duration_s <= 0 or self.cycles < 1:
            raise ValueError("duration_s must be positive and cycles at least 1")

    def gpu(self) -> GpuConfig:
        base, per_seq = self.step_base_ms, self.step_per_seq_ms
        if self.trace == "comfortable":
            base, per_seq = base * COMFORTABLE_STEP, per_seq * COMFORTABLE_STEP
        return GpuConfig(
            step_base_ms=base,
            step_per_seq_ms=per_seq,
            prefill_per_token_ms=self.prefill_per_token_ms,
            kv_cache_tokens=self.kv_cache_tokens,
        )

    def sim_config(self) -> SimConfig:
        return SimConfig(
            model_names=["demo"],
            max_num_seqs=self.max_num_seqs,
            scheduling_policy="priority",
            gpu=self.gpu(),
        )

    @property
    def window_s(self) -> float:
        return self.duration_s

    def live_rate(self, fill: float) -> float:
        """Arrivals/s that keep `fill × max_num_seqs` live sequences running (Little's law)."""
        running = fill * self.max_num_seqs
        engine = GpuEngine(self.gpu(), self.max_num_seqs, use_priority=False)
        mean_out = sum(self.live_output_tokens) / 2
        seconds = (mean_out + 1) * engine.step_ms(round(running)) / 1000.0
        return running / seconds

    def mean_rate(self) -> float:
        """The bursty trace's mean arrival rate (its quiet and busy phases are equally long),
        which every trace keeps."""
        return (self.live_rate(self.quiet_fill) + self.live_rate(self.busy_fill)) / 2

    def segments(self) -> list[Segment]:
        d = self.duration_s
        if self.trace == "steady":
            return [Segment(0.0, d, self.mean_rate(), "steady")]
        if self.trace == "step":
            low = self.mean_rate() * 2 / 3  # half the run at low, half at 2 × low: mean kept
            return [Segment(0.0, d / 2, low, "low"), Segment(d / 2, d, 2 * low, "high")]
        phase = d / (2 * self.cycles)
        quiet, busy = self.live_rate(self.quiet_fill), self.live_rate(self.busy_fill)
        if self.trace == "comfortable":
            quiet, busy = (self.live_rate(f) for f in COMFORTABLE_FILLS)
        out: list[Segment] = []
        for c in range(self.cycles):
            t = 2 * c * phase
            out += [
                Segment(t, t + phase, quiet, "quiet"),
                Segment(t + phase, t + 2 * phase, busy, "busy"),
            ]
        return out

    def schedule(self) -> list[Arrival]:
        """The seeded arrivals: the same for the same workload and seed."""
        rng = random.Random(self.seed)
        out: list[Arrival] = []
        for seg in self.segments():
            t = seg.start_s
            while (t := t + rng.expovariate(seg.rate)) < seg.end_s:
                words = rng.randint(*self.live_prompt_words)
                tokens = rng.randint(*self.live_output_tokens)
                out.append(Arrival(t, words, tokens, seg.phase))
        return out


def mean_rate_of(segments: list[Segment]) -> float:
    """Time-weighted mean arrival rate over the segments."""
    total = sum(s.end_s - s.start_s for s in segments)
    return sum(s.rate * (s.end_s - s.start_s) for s in segments) / total


def chat_body(words: int, tokens: int, **extra: Any) -> dict[str, Any]:
    prompt = " ".join(f"w{i}" for i in range(words))
    return {
        "model": "demo",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": tokens,
        **extra,
    }
