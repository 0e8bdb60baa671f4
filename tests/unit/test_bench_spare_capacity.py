"""The spare-capacity benchmark's pure parts (the replayed traces, the mode specs, the medians,
the ideal client's decision) and the ideal client against the GPU simulator."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import time
from typing import Any

import pytest

from bench.spare_capacity import (
    EXAMPLE,
    FIRST_ROUND,
    Mode,
    ModeResult,
    compare,
    continued,
    modes_from,
    reference_name,
    slowest,
    summarize,
)
from bench.spare_loads import IdealClient, IdealMove, InFlight, ideal_move, settings_for
from bench.spare_workload import Workload, mean_rate_of
from tools.sim import GpuConfig, SimConfig, SimServer
from tools.sim.gpu import ClassCounters, LatencyRecord


def test_bursty_schedule_is_seeded_and_alternates_quiet_and_busy_phases() -> None:
    w = Workload(duration_s=120, cycles=3, seed=7)
    arrivals = w.schedule()
    assert arrivals == Workload(duration_s=120, cycles=3, seed=7).schedule()
    assert arrivals != Workload(duration_s=120, cycles=3, seed=8).schedule()
    assert all(0 < a.at_s < w.window_s for a in arrivals)
    assert [a.at_s for a in arrivals] == sorted(a.at_s for a in arrivals)
    for a in arrivals:  # phases of 120 / (2 × 3) = 20 s alternate quiet, busy
        assert a.phase == ("busy" if int(a.at_s // 20) % 2 == 1 else "quiet")
        assert w.live_prompt_words[0] <= a.prompt_words <= w.live_prompt_words[1]
        assert w.live_output_tokens[0] <= a.output_tokens <= w.live_output_tokens[1]
    busy = sum(a.phase == "busy" for a in arrivals)
    expected = w.live_rate(w.busy_fill) / w.live_rate(w.quiet_fill)  # about 3.4 here
    assert busy / (len(arrivals) - busy) == pytest.approx(expected, rel=0.3)


def test_live_rate_follows_littles_law_on_the_model() -> None:
    w = Workload(max_num_seqs=20, step_base_ms=40, step_per_seq_ms=0, live_output_tokens=(49, 49))
    # 10 running, each lasting 50 steps of 40 ms = 2 s: 5 arrivals/s.
    assert w.live_rate(0.5) == pytest.approx(5.0)


@pytest.mark.parametrize("trace", ["bursty", "steady", "step"])
@pytest.mark.parametrize("duration", [20.0, 120.0])
def test_every_trace_spans_the_duration_with_the_bursty_mean_rate(
    trace: Any, duration: float
) -> None:
    w = Workload(trace=trace, duration_s=duration)
    segments = w.segments()
    assert segments[0].start_s == 0 and segments[-1].end_s == pytest.approx(duration)
    assert all(a.end_s == pytest.approx(b.start_s) for a, b in itertools.pairwise(segments))
    bursty = Workload(trace="bursty", duration_s=duration)
    assert mean_rate_of(segments) == pytest.approx(mean_rate_of(bursty.segments()))
    assert mean_rate_of(segments) == pytest.approx(w.mean_rate())
    assert all(0 < a.at_s < duration for a in w.schedule())


def test_steady_is_one_rate_with_as_many_arrivals_as_bursty() -> None:
    steady = Workload(trace="steady", duration_s=3000, seed=3)
    [segment] = steady.segments()
    assert segment.rate == pytest.approx(steady.mean_rate())
    assert {a.phase for a in steady.schedule()} == {"steady"}
    bursty = Workload(trace="bursty", duration_s=3000, cycles=100, seed=3)
    assert len(steady.schedule()) == pytest.approx(len(bursty.schedule()), rel=0.05)


def test_step_doubles_the_rate_half_way() -> None:
    w = Workload(trace="step", duration_s=3000, seed=5)
    low, high = w.segments()
    assert (low.phase, high.phase) == ("low", "high")
    assert (low.end_s, high.start_s) == (1500, 1500)
    assert high.rate == pytest.approx(2 * low.rate)
    arrivals = w.schedule()
    first = [a for a in arrivals if a.at_s < 1500]
    assert all(a.phase == "low" for a in first)
    assert (len(arrivals) - len(first)) / len(first) == pytest.approx(2.0, rel=0.1)


def test_workload_refuses_an_unknown_trace() -> None:
    with pytest.raises(ValueError, match="trace must be one of bursty, steady, step"):
        Workload(trace="spiky")  # type: ignore[arg-type]


def test_mode_specs() -> None:
    assert Mode.parse("live") == Mode("live only", "live_only")
    assert Mode.parse("live-gw").via_gateway
    assert Mode.parse("naive:8").concurrency == 8
    assert Mode.parse("cap:4").settings == {"max_concurrent_lines": 4}
    ideal = Mode.parse("ideal:2")
    # Its live traffic pays the proxy hop the live-gw reference pays (the issue: through the
    # gateway in every row), so its ratio is the batch's cost alone.
    assert (ideal.kind, ideal.keep_free, ideal.via_gateway) == ("ideal", 2, True)
    assert Mode.parse("first-round").settings == FIRST_ROUND
    shipped = json.loads(EXAMPLE.read_text())
    assert "preempt" in shipped and "seat_aware" in shipped
    assert Mode.parse("preempt").settings == shipped
    without = {k: v for k, v in shipped.items() if k != "preempt"}
    assert Mode.parse("seat-aware").settings == without
    restart = Mode.parse("preempt-restart")
    assert restart.settings == {**shipped, "preempt": {**shipped["preempt"], "resume": False}}
    assert restart.name != Mode.parse("preempt").name
    assert Mode.parse("preempt").resumes and not restart.resumes
    assert not Mode.parse("ideal:2").resumes and not Mode.parse("seat-aware").resumes
    for bad in ("cap", "naive:x", "ideal", "gates"):
        with pytest.raises(ValueError, match="unknown mode"):
            Mode.parse(bad)


def test_the_reference_row_goes_through_the_gateway_when_any_row_does() -> None:
    def names(modes: str) -> list[str]:
        return [m.name for m in modes_from(argparse.Namespace(modes=modes, mode_json=[]))]

    assert names("ideal:2,preempt") == ["live only (gateway)", *names("ideal:2,preempt")[1:]]
    assert names("cap:8")[0] == "live only (gateway)"
    assert names("naive:4")[0] == "live only"  # nothing through the gateway: no stack needed
    assert names("live,ideal:2") == ["live only", "ideal client, 2 kept free"]  # as asked


def test_settings_for_substitutes_the_simulator_url_and_its_seats() -> None:
    doc = {
        "max_concurrent_lines": 14,
        "seat_aware": {"seats": 16, "keep_free": 2},
        "server_load": {"metrics_url": "{sim_url}/metrics", "max_waiting": 0},
    }
    out = settings_for(doc, "http://127.0.0.1:9", seats=8)
    assert out["server_load"]["metrics_url"] == "http://127.0.0.1:9/metrics"
    assert out["seat_aware"] == {"seats": 8, "keep_free": 2}
    assert doc["seat_aware"] == {"seats": 16, "keep_free": 2}  # the preset itself is untouched
    assert settings_for({"max_concurrent_lines": 4}, "x", 8) == {"max_concurrent_lines": 4}


@pytest.mark.parametrize(
    ("live", "batch", "move"),
    [
        (0, 0, IdealMove(start=14)),  # an idle server: fill all but the 2 kept free
        (2, 10, IdealMove(start=2)),
        (4, 10, IdealMove()),  # exactly full beside live traffic and the 2 kept free
        (7, 10, IdealMove(cancel=3)),  # 3 live arrivals beyond the free seats
        (20, 5, IdealMove(cancel=5)),  # live traffic alone over the seats: every batch request
    ],
)
def test_ideal_move_keeps_batch_to_the_seats_live_traffic_leaves(
    live: int, batch: int, move: IdealMove
) -> None:
    assert ideal_move(seats=16, keep_free=2, live=live, batch=batch) == move


def result(
    name: str, rep: int, p99: float | None, *, live_tps: float = 100.0, **kw: Any
) -> ModeResult:
    defaults: dict[str, Any] = {
        "kind": "live_only" if name.startswith("live only") else "backfill",
        "seed": rep,
        "window_s": 120.0,
        "live_sent": 200,
        "live_errors": 0,
        "live_ttft_ms": {"p50": 100.0, "p95": 500.0, "p99": p99, "mean": 150.0},
        "live_e2e_ms": {},
        "sim_live_ttft_ms": {},
        "sim_batch_e2e_ms": {},
        "live_tokens_per_s": live_tps,
        "batch_tokens_per_s": 0.0,
        "batch_tokens": 0,
        "batch_aborted": 0,
        "batch_aborted_tokens": 0,
        "peak_waiting": 0,
    }
    return ModeResult(name=name, rep=rep, **{**defaults, **kw})


def test_runs_compare_with_their_own_repetitions_reference_and_summarize_to_medians() -> None:
    runs = [
        result("live only (gateway)", 0, 1000.0, live_tps=110.0),
        result(
            "a", 0, 1500.0, batch_tokens_per_s=45.0, batch_tokens=5400, batch_aborted_tokens=540
        ),
        result("live only (gateway)", 1, 2000.0, live_tps=120.0),
        result("a", 1, 2000.0, batch_tokens_per_s=40.0, batch_tokens=4800, live_errors=2),
        result("live only (gateway)", 2, 1000.0, live_tps=100.0),
        result(
            "a", 2, 3000.0, batch_tokens_per_s=20.0, batch_tokens=2400, batch_aborted_tokens=960
        ),
    ]
    assert reference_name(runs) == "live only (gateway)"
    spare = compare(runs, capacity_tokens_per_s=200.0)
    assert spare == {0: 90.0, 1: 80.0, 2: 100.0}
    a0, a1, a2 = runs[1::2]
    assert (a0.ttft_p99_vs_reference, a1.ttft_p99_vs_reference, a2.ttft_p99_vs_reference) == (
        1.5,
        1.0,
        3.0,
    )
    assert (a0.batch_share_of_spare, a1.batch_share_of_spare, a2.batch_share_of_spare) == (
        0.5,
        0.5,
        0.2,
    )
    assert (a0.wasted_share, a1.wasted_share, a2.wasted_share) == (0.1, 0.0, 0.4)
    ref, a = summarize(runs)
    assert (ref.name, ref.runs, a.name, a.runs) == ("live only (gateway)", 3, "a", 3)
    assert a.live_ttft_ms == {"p50": 100.0, "p95": 500.0, "p99": 2000.0}
    assert (a.ttft_p99_vs_reference, a.batch_share_of_spare) == (1.5, 0.5)
    assert (a.batch_tokens_per_s, a.wasted_share, a.live_errors) == (40.0, 0.1, 2)
    assert ref.wasted_share is None  # no batch tokens: no share, and not a 0 in the median


def test_a_resumed_lines_tokens_are_kept_and_useful_share_counts_only_kept_tokens() -> None:
    runs = [
        result("live only (gateway)", 0, 1000.0, live_tps=100.0),
        # 4000 batch tokens generated, 1000 of them by requests aborted, 800 of those continued.
        result(
            "a",
            0,
            1000.0,
            batch_tokens_per_s=50.0,
            batch_tokens=4000,
            batch_aborted_tokens=1000,
            batch_kept_tokens=800,
        ),
        # A restart: every aborted token thrown away.
        result(
            "b", 0, 1000.0, batch_tokens_per_s=50.0, batch_tokens=4000, batch_aborted_tokens=1000
        ),
    ]
    compare(runs, capacity_tokens_per_s=200.0)  # spare 100 tok/s
    _, a, b = runs
    assert (a.wasted_tokens, a.wasted_share, b.wasted_share) == (200, 0.05, 0.25)
    assert a.batch_share_of_spare == b.batch_share_of_spare == 0.5
    assert (a.useful_share_of_spare, b.useful_share_of_spare) == (0.475, 0.375)
    [_, sa, sb] = summarize(runs)
    assert (sa.useful_share_of_spare, sb.useful_share_of_spare) == (0.475, 0.375)


async def test_the_windows_aborts_are_waited_for_until_continued() -> None:
    batch = ClassCounters(aborted_tokens_at=[(1.0, 30), (2.0, 0), (5.0, 20)])
    batch.kept_at = [(1.0, 30)]  # the abort with no token never is continued: not waited for
    started = time.monotonic()
    await continued(batch, until=3.0, within=30)  # the one at 5.0 is after the window
    assert time.monotonic() - started < 1
    batch.kept_at = []
    started = time.monotonic()
    await continued(batch, until=3.0, within=0.5)  # never continued: the limit ends the wait
    assert time.monotonic() - started >= 0.5


def test_medians_skip_runs_without_a_figure() -> None:
    runs = [result("a", 0, None), result("a", 1, 300.0), result("a", 2, 100.0)]
    [a] = summarize(runs)
    assert a.live_ttft_ms["p99"] == 200.0
    assert reference_name([result("live only", 0, 1.0), *runs]) == "live only"


async def until(pred: Any, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not pred():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)  # polling the simulator's observable state


async def test_ideal_client_closes_its_youngest_requests_and_the_simulator_aborts_them() -> None:
    gpu = GpuConfig(step_base_ms=10, step_per_seq_ms=0)
    config = SimConfig(max_num_seqs=4, scheduling_policy="priority", gpu=gpu)
    workload = Workload(max_num_seqs=4, batch_output_tokens=10_000)  # longer than the test
    live = InFlight()
    async with SimServer(config) as sim:
        engine = sim.app.engine
        assert engine is not None
        client = IdealClient(sim, workload, keep_free=1, live=live)
        try:
            assert client.step() == IdealMove(start=3)
            first = list(client._flying)
            await until(lambda: engine.running == 3 and engine.log.batch.generated_tokens > 0)
            live.n = 2  # two live requests arrive: only one seat is left beside them
            assert client.step() == IdealMove(cancel=2)
            assert first[1].cancelled() or first[1].cancelling()
            assert first[2].cancelled() or first[2].cancelling()
            assert client._flying == first[:1] and not first[0].done()
            await until(lambda: engine.log.batch.aborted == 2 and engine.running == 1)
            assert 0 < engine.log.batch.aborted_tokens < engine.log.batch.generated_tokens
            live.n = 0
            assert client.step() == IdealMove(start=2)
            await until(lambda: engine.running == 3)
        finally:
            stats = await client.stop()
    assert stats["batch_requests_cancelled"] == 2
    assert stats["batch_requests_resubmitted"] == 2


def test_slowest_keeps_the_longest_live_ttfts_with_the_batch_aborts_around_them() -> None:
    def rec(arrival: float, ttft: float) -> LatencyRecord:
        return LatencyRecord("live", arrival, ttft, ttft + 1, ttft / 2, 10, 5, 0, False)

    live = [rec(100.0, 0.1), rec(105.0, 0.9), rec(110.0, 0.3)]
    aborts = [99.0, 104.5, 105.2, 107.0]  # 104.5 and 105.2 around the slow one; 107 after it
    out = slowest(live, aborts, since=95.0, n=2)
    assert [r["at_s"] for r in out] == [10.0, 15.0]  # the two slowest, slowest first
    assert out[0] == {
        "at_s": 10.0,
        "ttft_ms": 900.0,
        "queued_ms": 450.0,
        "batch_aborts_ms": [-500.0, 200.0],
    }
    assert out[1]["batch_aborts_ms"] == []
