"""The maintenance hold, pure: closed from `start` until `end` with the wake-ups the scheduler
sleeps on, first among the gates, bounded settings; and a route without it decides exactly as
it did before the gate existed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from temporalio.contrib.pydantic import pydantic_data_converter

from backfill.platform.config import load_settings
from backfill.platform.messages import SchedulerInput
from backfill.routes.gates import GATES, Gate, GateContext, route_gate
from backfill.routes.gates import maintenance as hold_gate
from backfill.routes.gates.backoff import Backoff
from backfill.routes.gates.base import OPEN
from backfill.routes.gates.maintenance import MAX_HOLD, MaintenanceHold
from backfill.routes.gates.server_load import LoadVerdict
from backfill.routes.reasons import WaitReason
from backfill.routes.scheduler_client import scheduler_input
from backfill.routes.settings import RouteSettings

START = datetime(2026, 12, 5, 1, 30, tzinfo=UTC)
END = START + timedelta(hours=2)
HOLD = {"start": "2026-12-05T01:30:00Z", "end": "2026-12-05T04:30:00+01:00"}  # 03:30 UTC
WINDOW = {"time_zone": "UTC", "days": ["sat"], "from": "03:00", "until": "05:00"}


def ctx(at: datetime, **states: Any) -> GateContext:
    return GateContext(now=at, states=states)


def test_the_hold_closes_from_its_start_until_its_end_and_wakes_at_both() -> None:
    hold = MaintenanceHold.model_validate(HOLD)
    assert (hold.start, hold.end) == (START, END)
    before = hold_gate.decide(hold, ctx(START - timedelta(minutes=1)))
    assert (before.open, before.reason, before.wake_at) == (True, None, START.timestamp())
    for at in (START, END - timedelta(seconds=1)):
        during = hold_gate.decide(hold, ctx(at))
        assert (during.open, during.reason) == (False, WaitReason.MAINTENANCE)
        assert during.wake_at == END.timestamp()
        assert during.detail == "until 2026-12-05T04:30:00+01:00"
    for at in (END, END + timedelta(days=400)):  # over: open, nothing more to wake for
        assert hold_gate.decide(hold, ctx(at)) == OPEN


def test_the_hold_names_the_reason_before_every_other_closed_gate() -> None:
    settings = RouteSettings.model_validate(
        {
            "maintenance": HOLD,
            "time_window": WINDOW,
            "server_load": {"metrics_url": "http://h:8100/metrics", "max_waiting": 0},
        }
    )
    during = START + timedelta(minutes=10)  # 01:40, outside the 03:00-05:00 window too
    busy = LoadVerdict(state="busy", detail="waiting requests 3 > 0")
    g = route_gate(settings, ctx(during, load=busy, backoff=Backoff(until=during.timestamp() + 9)))
    assert (g.open, g.reason, g.wake_at) == (False, WaitReason.MAINTENANCE, END.timestamp())
    after = END + timedelta(minutes=1)  # 03:31: the window is open, the server busy
    g = route_gate(settings, ctx(after, load=busy))
    assert (g.open, g.reason) == (False, WaitReason.BUSY)
    before = START - timedelta(hours=1)  # open until the hold starts: it wakes the scheduler
    g = route_gate(RouteSettings.model_validate({"maintenance": HOLD}), ctx(before))
    assert g == Gate(True, wake_at=START.timestamp())


@pytest.mark.parametrize("hours", [-30, 0.5, 1.9, 2.5, 30])
def test_a_route_without_a_hold_decides_as_without_the_gate(hours: float) -> None:
    """Absent (null), the gate is not there: every route's settings stored before it decide the
    same answers, wake-ups included, as the registry without it."""
    stored = {
        "max_concurrent_lines": 4,
        "time_window": WINDOW,
        "yield_to_live_traffic": {"pause_at_in_flight": 2},
    }
    settings = RouteSettings.model_validate(stored)
    assert settings.maintenance is None
    others = tuple(e for e in GATES if e is not hold_gate.ENTRY)
    at = ctx(START + timedelta(hours=hours), backoff=Backoff(until=START.timestamp() + 600))
    assert route_gate(settings, at) == route_gate(settings, at, others)


def test_stored_settings_and_histories_without_the_field_read_as_off() -> None:
    """A scheduler's input recorded before the gate existed decodes with the hold off, and one
    with the hold set goes through the data converter (history) unchanged."""
    old = pydantic_data_converter.payload_converter.to_payloads(
        [{"route_id": "r", "settings": {"max_concurrent_lines": 3, "time_window": WINDOW}}]
    )
    (decoded,) = pydantic_data_converter.payload_converter.from_payloads(old, [SchedulerInput])
    assert decoded.settings.maintenance is None
    new = SchedulerInput(route_id="r", settings=RouteSettings.model_validate({"maintenance": HOLD}))
    payloads = pydantic_data_converter.payload_converter.to_payloads([new])
    assert pydantic_data_converter.payload_converter.from_payloads(payloads, [SchedulerInput]) == [
        new
    ]
    assert b'"start":"2026-12-05T01:30:00Z"' in payloads[0].data


@pytest.mark.parametrize(
    ("doc", "why"),
    [
        ({"start": "2026-12-05T01:30:00", "end": "2026-12-05T03:30:00Z"}, "timezone"),
        ({"start": "2026-12-05T03:30:00Z", "end": "2026-12-05T03:30:00Z"}, "after"),
        ({"start": "2026-12-05T03:30:00Z", "end": "2026-12-05T01:30:00Z"}, "after"),
        ({"start": "2026-12-05T01:30:00Z", "end": "2027-01-05T01:30:01Z"}, "31 days"),
        ({"start": "tonight", "end": "2026-12-05T01:30:00Z"}, "datetime"),
        ({"start": "2026-12-05T01:30:00Z"}, "end"),
        ({"from": "2026-12-05T01:30:00Z", "until": "2026-12-05T03:30:00Z"}, "extra"),
        ({**HOLD, "reason": "driver upgrade"}, "extra"),
    ],
)
def test_a_hold_that_is_not_two_instants_a_bounded_span_apart_is_refused(
    doc: dict[str, Any], why: str
) -> None:
    with pytest.raises(ValidationError, match=why):
        RouteSettings.model_validate({"maintenance": doc})


def test_the_longest_hold_is_accepted() -> None:
    hold = MaintenanceHold.model_validate(
        {"start": START.isoformat(), "end": (START + MAX_HOLD).isoformat()}
    )
    assert hold.end - hold.start == timedelta(days=31)


def test_the_console_form_shows_the_hold_and_reads_it_back() -> None:
    entry = hold_gate.ENTRY
    hold = MaintenanceHold.model_validate(HOLD)
    values = entry.form_values(hold)
    assert set(values) == {"maintenance.start", "maintenance.end"}
    assert MaintenanceHold.model_validate(entry.document(values)) == hold
    assert entry.document({"maintenance.start": "", "maintenance.end": ""}) is None
    assert entry.summary(hold) == "2026-12-05T01:30:00+00:00 – 2026-12-05T04:30:00+01:00"


def test_a_hold_in_the_config_file_is_read_as_json_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TOML's own date-times (or strings) in a route's settings table: the table the scheduler
    keeps to tell the next one's changes holds them as JSON text, so the same file read again
    is the same table (a PUT keeps winning until the file changes)."""
    for name in ("BACKFILL_CONFIG", "GATEWAY_LOCAL_UPSTREAMS"):
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "backfill.toml"
    path.write_text(
        '[[models]]\nid = "m"\n[[models.routes]]\nid = "gpu-a"\n'
        'base_url = "http://127.0.0.1:8100/v1"\n'
        "[models.routes.settings.maintenance]\n"
        'start = 2026-12-05T01:30:00Z\nend = "2026-12-05T04:30:00+01:00"\n'
    )
    inp = scheduler_input(load_settings(path), "gpu-a")
    assert inp.settings.maintenance == MaintenanceHold.model_validate(HOLD)
    assert inp.configured == {"maintenance": HOLD}
    again = scheduler_input(load_settings(path), "gpu-a")
    assert again.configured == inp.configured
