"""The spare-capacity benchmark's pure parts: the replayed live workload and the mode specs."""

from __future__ import annotations

import pytest

from bench.spare_capacity import Mode, Workload


def test_schedule_is_seeded_bursty_and_inside_the_window() -> None:
    w = Workload(quiet_s=20, busy_s=20, cycles=3, seed=7)
    arrivals = w.schedule()
    assert arrivals == Workload(quiet_s=20, busy_s=20, cycles=3, seed=7).schedule()
    assert arrivals != Workload(quiet_s=20, busy_s=20, cycles=3, seed=8).schedule()
    assert all(0 < a.at_s < w.window_s for a in arrivals)
    assert [a.at_s for a in arrivals] == sorted(a.at_s for a in arrivals)
    for a in arrivals:  # phases alternate quiet, busy every 20 s
        assert a.busy == (int(a.at_s // 20) % 2 == 1)
        assert w.live_prompt_words[0] <= a.prompt_words <= w.live_prompt_words[1]
        assert w.live_output_tokens[0] <= a.output_tokens <= w.live_output_tokens[1]
    busy = sum(a.busy for a in arrivals)
    expected = w.live_rate(w.busy_fill) / w.live_rate(w.quiet_fill)  # about 3.4 here
    assert busy / (len(arrivals) - busy) == pytest.approx(expected, rel=0.3)


def test_live_rate_follows_littles_law_on_the_model() -> None:
    w = Workload(max_num_seqs=20, step_base_ms=40, step_per_seq_ms=0, live_output_tokens=(49, 49))
    # 10 running, each lasting 50 steps of 40 ms = 2 s: 5 arrivals/s.
    assert w.live_rate(0.5) == pytest.approx(5.0)


def test_mode_specs() -> None:
    assert Mode.parse("live") == Mode("live only", "live_only")
    assert Mode.parse("live-gw").via_gateway
    assert Mode.parse("naive:8").concurrency == 8
    assert Mode.parse("cap:4").settings == {"max_concurrent_lines": 4}
    for bad in ("cap", "naive:x", "gates"):
        with pytest.raises(ValueError, match="unknown mode"):
            Mode.parse(bad)
