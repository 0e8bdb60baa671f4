"""The management API's route status is the scheduler's status, declared once: the api adds its
own counts to the scheduler's fields and answers `backoff_until` in whole unix seconds whatever
the scheduler holds."""

from __future__ import annotations

from api.schemas import SchedulingStatus
from backfill.route_settings import RouteSettings
from backfill.route_status import RouteState, SchedulerStatus


def test_the_api_s_status_declares_none_of_the_scheduler_s_fields_again() -> None:
    """Every field the scheduler's status and the api's share is `RouteState`'s, declared once
    (the gates' fields among them): the api's model adds only its own."""
    shared = set(SchedulerStatus.model_fields) & set(SchedulingStatus.model_fields)
    assert shared == set(RouteState.model_fields)
    assert "backoff_until" in shared
    schema = SchedulingStatus.model_json_schema(mode="serialization")
    backoff = schema["properties"]["backoff_until"]["anyOf"]
    assert {"type": "integer"} in backoff and {"type": "number"} not in backoff


def test_a_back_off_end_is_whole_unix_seconds_from_any_scheduler() -> None:
    """The back-off gate keeps fractions (and a worker of an earlier version answered them):
    the status holds the second, as the api always answered."""
    status = SchedulerStatus(
        route_id="r",
        settings=RouteSettings(),
        limit=2,
        allotted=0,
        held=0,
        queued_lines=0,
        batches=[],
        backoff_until=1_765_000_010.75,
    )
    assert status.backoff_until == 1_765_000_010
    assert SchedulerStatus.model_validate_json(status.model_dump_json()) == status
    shown = SchedulingStatus(
        **{name: getattr(status, name) for name in RouteState.model_fields}, running_lines=0
    )
    assert shown.model_dump(mode="json")["backoff_until"] == 1_765_000_010
