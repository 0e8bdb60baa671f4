"""The route's gates, pure: which gate closes first names the reason, when the answer changes
with time alone, live counts summed and forgotten, the rate-limit back-off."""

from __future__ import annotations

import pytest

from backfill.gates import (
    LIVE_REPORT_TTL,
    REASON_BACKOFF,
    REASON_BUSY,
    REASON_LIVE,
    REASON_METRICS,
    REASON_WINDOW,
    Backoff,
    LiveCount,
    back_off,
    forget_stale,
    live_expiry,
    live_in_flight,
    route_gate,
)

NOW = 1_000_000.0


def test_every_gate_open_by_default() -> None:
    gate = route_gate(now=NOW)
    assert gate.open and gate.reason is None and gate.wake_at is None


def test_live_traffic_at_the_threshold_closes_below_it_opens() -> None:
    live = {"a": LiveCount(in_flight=1, at=NOW), "b": LiveCount(in_flight=1, at=NOW - 5)}
    closed = route_gate(now=NOW, live_threshold=2, live=live)
    assert (closed.open, closed.reason) == (False, REASON_LIVE)
    assert closed.wake_at == NOW - 5 + LIVE_REPORT_TTL  # when b's count would be forgotten
    assert route_gate(now=NOW, live_threshold=3, live=live).open
    assert route_gate(now=NOW, live_threshold=None, live=live).open  # the gate is off


def test_a_process_that_stops_reporting_is_forgotten_after_the_ttl() -> None:
    live = {
        "dead": LiveCount(in_flight=5, at=NOW - LIVE_REPORT_TTL),
        "up": LiveCount(in_flight=1, at=NOW),
    }
    assert live_in_flight(live, NOW) == 1
    assert set(forget_stale(live, NOW)) == {"up"}
    assert route_gate(now=NOW, live_threshold=2, live=live).open
    assert live_expiry(live, NOW) == NOW + LIVE_REPORT_TTL


def test_backoff_closes_until_it_ends() -> None:
    b = Backoff(until=NOW + 2, level=1, last_at=NOW)
    gate = route_gate(now=NOW, backoff=b)
    assert (gate.open, gate.reason, gate.wake_at) == (False, REASON_BACKOFF, NOW + 2)
    assert route_gate(now=NOW + 2, backoff=b).open


@pytest.mark.parametrize(
    ("state", "reason"), [("unavailable", REASON_METRICS), ("busy", REASON_BUSY), ("open", None)]
)
def test_server_load_verdicts(state: str, reason: str | None) -> None:
    gate = route_gate(now=NOW, load_state=state, load_error="boom")
    assert gate.reason == reason and gate.open is (reason is None)
    if reason == REASON_METRICS:
        assert gate.detail == "boom"


def test_the_first_closed_gate_names_the_reason() -> None:
    everything = dict(
        backoff=Backoff(until=NOW + 5, level=1, last_at=NOW),
        live_threshold=1,
        live={"a": LiveCount(in_flight=3, at=NOW)},
        load_state="busy",
    )
    assert (
        route_gate(now=NOW, window_open=False, window_changes_at=NOW + 60, **everything).reason
        == REASON_WINDOW
    )  # type: ignore[arg-type]
    assert route_gate(now=NOW, **everything).reason == REASON_BACKOFF  # type: ignore[arg-type]
    everything["backoff"] = Backoff()
    assert route_gate(now=NOW, **everything).reason == REASON_LIVE  # type: ignore[arg-type]


def test_backoff_doubles_to_a_minute_honours_retry_after_and_resets_after_a_quiet_spell() -> None:
    b = Backoff()
    delays = []
    t = NOW
    for _ in range(9):
        b = back_off(b, t, None)
        assert b.until is not None
        delays.append(b.until - t)
        t = b.until
    assert delays == [1, 2, 4, 8, 16, 32, 60, 60, 60]
    assert back_off(Backoff(), NOW, 10).until == NOW + 10  # Retry-After longer than 1 s
    quiet = back_off(b, t + 10, None)  # 10 s after the last pause ended: the upstream recovered
    assert quiet.until == t + 10 + 1 and quiet.level == 1
    held = back_off(Backoff(until=NOW + 30, level=1, last_at=NOW), NOW + 1, None)
    assert held.until == NOW + 30  # a shorter one never cuts a longer one short


def test_a_route_refused_now_and_then_pauses_a_second_each_time() -> None:
    b = Backoff()
    for i in range(5):  # the reporting batch had a success between each refusal
        b = back_off(b, NOW + 30 * i, None, consecutive=1)
        assert b.until == NOW + 30 * i + 1
    storm = back_off(Backoff(), NOW, None, consecutive=4)
    assert storm.until == NOW + 8  # four refusals in a row: 2 ** 3
