"""`RouteSettings` is written out as a class (mypy and grep see every field); its JSON shape is the
one recorded histories and clients hold, and its gate fields are the registry's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from backfill.routes.gates.registry import SETTINGS_GATES
from backfill.routes.settings import RouteSettings

BEFORE = Path(__file__).parents[1] / "fixtures" / "route_settings_before_classes.json"
"""The schema and dumps of `RouteSettings` as `pydantic.create_model` built it from the registry
(generated once from that code, before the class was written out)."""

EVERY_FIELD: dict[str, Any] = {
    "max_concurrent_lines": 7,
    "maintenance": {"start": "2026-01-01T00:00:00+00:00", "end": "2026-01-02T00:00:00+00:00"},
    "time_window": {"time_zone": "UTC", "days": ["mon"], "from": "01:00", "until": "02:00"},
    "yield_to_live_traffic": {"pause_at_in_flight": 3},
    "server_load": {"metrics_url": "http://x/metrics", "max_waiting": 1},
    "seat_aware": {"seats": 4, "keep_free": 1},
    "preempt": {"max_preemptions": 2},
    "reopen_ramp": {"initial": 1, "double_every_s": 10},
    "priority_hint": 5,
}


def test_the_settings_document_is_the_one_create_model_built() -> None:
    """Same JSON schema (validation and serialization: fields, order, defaults, descriptions,
    `additionalProperties: false`) and the same serialized form, defaults and every field set."""
    before = json.loads(BEFORE.read_text())
    assert RouteSettings.model_json_schema() == before["schema"]
    assert RouteSettings.model_json_schema(mode="serialization") == before["schema_serialization"]
    assert RouteSettings().model_dump(mode="json") == before["default_dump"]
    assert RouteSettings.model_validate(EVERY_FIELD).model_dump(mode="json") == before["full_dump"]


def test_each_gate_with_settings_has_its_field_typed_by_its_model_in_registry_order() -> None:
    """The registry says which gates have settings; the class declares their fields: they
    agree, field by field, in the registry's order between the cap and the priority hint."""
    assert list(RouteSettings.model_fields) == [
        "max_concurrent_lines",
        *(g.name for g in SETTINGS_GATES),
        "priority_hint",
    ]
    for g in SETTINGS_GATES:
        field = RouteSettings.model_fields[g.name]
        assert field.annotation == (g.model | None), g.name
        assert field.default is None
        assert field.description == g.doc
