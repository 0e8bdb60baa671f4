"""The route's gates, pure: which gate closes first names the reason, when the answer changes
with time alone, live counts summed and forgotten, the rate-limit back-off; and the registry
that the settings document and the console derive from."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from temporalio import activity
from temporalio.contrib.pydantic import pydantic_data_converter

from activities.server_load import ServerLoadActivities
from backfill.platform.messages import SchedulerInput
from backfill.routes.gates import GATES, SETTINGS_GATES, Gate, GateContext, registry, route_gate
from backfill.routes.gates import backoff as backoff_gate
from backfill.routes.gates import live as live_gate
from backfill.routes.gates.backoff import Backoff, back_off
from backfill.routes.gates.live import (
    LIVE_REPORT_TTL,
    LiveCount,
    forget_stale,
    live_expiry,
    live_in_flight,
)
from backfill.routes.gates.server_load import LoadVerdict
from backfill.routes.reasons import WaitReason
from backfill.routes.settings import RouteSettings
from workflows import patches

REASON_BACKOFF, REASON_BUSY, REASON_LIVE = WaitReason.BACKOFF, WaitReason.BUSY, WaitReason.LIVE
REASON_METRICS, REASON_WINDOW = WaitReason.METRICS, WaitReason.WINDOW

NOW = 1_000_000.0
METRICS_URL = "http://h:8100/metrics"
# Monday 1970-01-12 13:46:40 UTC: a window of 14:00-15:00 on Mondays opens at NOW + 800.
WINDOW = {"time_zone": "UTC", "days": ["mon"], "from": "14:00", "until": "15:00"}
WINDOW_OPENS = NOW + 800


def gate(
    *,
    now: float = NOW,
    window: bool = False,
    live_threshold: int | None = None,
    load_state: str | None = None,
    load_error: str | None = None,
    **state: Any,
) -> Gate:
    """`route_gate` for settings with the gates named on, and the scheduler's state."""
    settings = RouteSettings(
        time_window=WINDOW if window else None,
        yield_to_live_traffic={"pause_at_in_flight": live_threshold} if live_threshold else None,
        server_load={"metrics_url": METRICS_URL, "max_waiting": 0} if load_state else None,
    )
    load = None
    if load_state not in (None, "none"):
        load = LoadVerdict(state=load_state, detail=load_error)  # type: ignore[arg-type]
    ctx = GateContext(now=datetime.fromtimestamp(now, UTC), states={"load": load, **state})
    return route_gate(settings, ctx)


def test_every_gate_open_by_default() -> None:
    answer = gate()
    assert answer.open and answer.reason is None and answer.wake_at is None


def test_live_traffic_at_the_threshold_closes_below_it_opens() -> None:
    live = {"a": LiveCount(in_flight=1, at=NOW), "b": LiveCount(in_flight=1, at=NOW - 5)}
    closed = gate(live_threshold=2, live=live)
    assert (closed.open, closed.reason) == (False, REASON_LIVE)
    assert closed.wake_at == NOW - 5 + LIVE_REPORT_TTL  # when b's count would be forgotten
    assert gate(live_threshold=3, live=live).open
    assert gate(live_threshold=None, live=live).open  # the gate is off


def test_a_process_that_stops_reporting_is_forgotten_after_the_ttl() -> None:
    live = {
        "dead": LiveCount(in_flight=5, at=NOW - LIVE_REPORT_TTL),
        "up": LiveCount(in_flight=1, at=NOW),
    }
    assert live_in_flight(live, NOW) == 1
    assert set(forget_stale(live, NOW)) == {"up"}
    assert gate(live_threshold=2, live=live).open
    assert live_expiry(live, NOW) == NOW + LIVE_REPORT_TTL


def test_backoff_closes_until_it_ends() -> None:
    b = Backoff(until=NOW + 2, level=1, last_at=NOW)
    closed = gate(backoff=b)
    assert (closed.open, closed.reason, closed.wake_at) == (False, REASON_BACKOFF, NOW + 2)
    assert gate(now=NOW + 2, backoff=b).open


@pytest.mark.parametrize(
    ("state", "reason"), [("unavailable", REASON_METRICS), ("busy", REASON_BUSY), ("open", None)]
)
def test_server_load_verdicts(state: str, reason: str | None) -> None:
    answer = gate(load_state=state, load_error="boom")
    assert answer.reason == reason and answer.open is (reason is None)
    if reason == REASON_METRICS:
        assert answer.detail == "boom"


def test_no_verdict_yet_is_metrics_unavailable() -> None:
    answer = gate(load_state="none")
    assert (answer.open, answer.reason, answer.detail) == (False, REASON_METRICS, "no reading yet")


def test_the_first_closed_gate_names_the_reason() -> None:
    everything: dict[str, Any] = dict(
        backoff=Backoff(until=NOW + 5, level=1, last_at=NOW),
        live_threshold=1,
        live={"a": LiveCount(in_flight=3, at=NOW)},
        load_state="busy",
    )
    closed = gate(window=True, **everything)
    assert (closed.reason, closed.wake_at) == (REASON_WINDOW, WINDOW_OPENS)
    assert gate(**everything).reason == REASON_BACKOFF
    everything["backoff"] = Backoff()
    assert gate(**everything).reason == REASON_LIVE
    everything["live"] = {}
    assert gate(**everything).reason == REASON_BUSY


def test_the_window_s_next_edge_is_when_any_later_answer_may_change() -> None:
    inside = WINDOW_OPENS + 60  # open until 15:00, NOW + 4400
    assert gate(now=inside, window=True) == Gate(True, wake_at=NOW + 4400)
    backing_off = Backoff(until=inside + 5, level=1, last_at=inside)
    assert gate(now=inside, window=True, backoff=backing_off).wake_at == inside + 5
    busy = gate(now=inside, window=True, load_state="busy")
    assert (busy.reason, busy.wake_at) == (REASON_BUSY, NOW + 4400)


def test_the_registry_checks_in_order_and_derives_the_settings_fields() -> None:
    assert [g.name for g in GATES] == [
        "maintenance",
        "time_window",
        "backoff",
        "yield_to_live_traffic",
        "server_load",
        "seat_aware",
        "preempt",
        "reopen_ramp",
    ]
    gate_fields = set(RouteSettings.model_fields) - {"max_concurrent_lines", "priority_hint"}
    assert gate_fields == {g.name for g in SETTINGS_GATES}
    assert all(RouteSettings().model_dump()[g.name] is None for g in SETTINGS_GATES)
    assert [g.reader.activity for g in GATES if g.reader] == ["watch_server_load"]


def test_each_gate_s_life_is_in_its_entry() -> None:
    """State keys are unique (they are `SchedulerInput.gates` keys in recorded histories), every
    patch a gate asks is one of `workflows.patches`, every reader an activity a worker runs."""
    keys = [g.state.key for g in GATES if g.state is not None]
    assert keys == ["backoff", "live", "load", "held_back", "ramp"]
    known = {v for k, v in vars(patches).items() if k.isupper() and isinstance(v, str)}
    assert {g.patch for g in GATES if g.patch} == {patches.SEATS_HELD_BACK, patches.REOPEN_RAMP}
    assert {g.patch for g in GATES if g.patch} <= known
    assert all(g.state is not None for g in GATES if g.signals or g.shape)
    assert (
        activity._Definition.must_from_callable(ServerLoadActivities.watch_server_load).name
        == "watch_server_load"
    )


def test_a_scheduler_input_from_before_the_registry_keeps_its_gate_states() -> None:
    old = {
        "route_id": "r",
        "live": {"api-1": {"in_flight": 3, "at": NOW}},
        "backoff": {"until": NOW + 5, "level": 2, "last_at": NOW},
        "load": {"state": "busy", "detail": "waiting requests 3 > 0"},
        "ramp": None,
        "held_back": {},
    }
    s = SchedulerInput.model_validate(old)
    assert set(s.gates) == {"live", "backoff", "load", "ramp", "held_back"}
    again = SchedulerInput.model_validate_json(s.model_dump_json())
    ctx = registry.context(
        s.settings,
        again.gates,
        now=datetime.fromtimestamp(NOW, UTC),
        batch_lines=0,
        cap=2,
        joined=lambda e: True,
    )
    assert ctx.state_of(backoff_gate.STATE) == Backoff(until=NOW + 5, level=2, last_at=NOW)
    assert ctx.state_of(live_gate.STATE)["api-1"].in_flight == 3
    assert registry.route_gate(s.settings, ctx).reason == WaitReason.BACKOFF


def test_the_built_in_gates_states_are_written_where_older_workers_read_them() -> None:
    """A continue-as-new input (as Temporal's pydantic converter writes it) keeps the built-in
    gates' states in their own fields, so a worker from before the registry reads the same
    state; another gate's state is under `gates`."""
    s = SchedulerInput(route_id="r")
    s.gates["backoff"] = back_off(Backoff(), NOW, None)
    s.gates["live"] = {"api-1": LiveCount(in_flight=2, at=NOW)}
    s.gates["test_hold"] = {"on": True}
    [payload] = pydantic_data_converter.payload_converter.to_payloads([s])
    doc = json.loads(payload.data)
    assert doc["backoff"]["until"] == NOW + 1 and doc["live"]["api-1"]["in_flight"] == 2
    assert doc["gates"] == {"test_hold": {"on": True}}
    assert "gates" not in SchedulerInput(route_id="r").model_dump()
    [back] = pydantic_data_converter.payload_converter.from_payloads([payload], [SchedulerInput])
    assert set(back.gates) == {"backoff", "live", "test_hold"}
    assert backoff_gate.STATE.read(back.gates) == s.gates["backoff"]


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
