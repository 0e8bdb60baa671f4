"""Admission's pure rules: the exact count per workspace, the grace before a check, and the
pinned inputs counted towards stored bytes."""

from __future__ import annotations

from backfill.tenancy.admission import (
    RELEASED_KEPT,
    Reservation,
    ReserveRequest,
    decide,
    due_for_check,
    pinned_bytes,
    remember_released,
)


def _held(
    batch_id: str, *, lines: int = 10, file_id: str = "file-a", at: float = 0.0
) -> Reservation:
    return Reservation(
        batch_id=batch_id, input_file_id=file_id, input_bytes=100, lines=lines, reserved_at=at
    )


def _req(batch_id: str, **limits: int | None) -> ReserveRequest:
    return ReserveRequest(
        batch_id=batch_id, input_file_id="file-a", input_bytes=100, lines=10, **limits
    )


def test_the_last_slot_goes_once() -> None:
    held = [_held("b1")]
    assert decide([], _req("b1", max_active_batches=1)).accepted
    refused = decide(held, _req("b2", max_active_batches=1))
    assert not refused.accepted and refused.refused_by == "max_active_batches"
    assert refused.active == 1


def test_a_retried_reservation_is_accepted_as_held() -> None:
    result = decide([_held("b1")], _req("b1", max_active_batches=1))
    assert result.accepted and result.active == 1 and result.lines == 10


def test_queued_lines_limit_counts_every_held_batch() -> None:
    held = [_held("b1", lines=60), _held("b2", lines=30)]
    assert decide(held, _req("b3", max_queued_lines=100)).accepted
    refused = decide(held, _req("b3", max_queued_lines=99))
    assert refused.refused_by == "max_queued_lines" and refused.lines == 90


def test_no_limits_accept_everything() -> None:
    held = [_held(f"b{i}") for i in range(1000)]
    result = decide(held, _req("new"))
    assert result.accepted and result.active == 1001


def test_a_young_reservation_is_not_checked() -> None:
    held = [_held("old", at=0.0), _held("young", at=50.0)]
    assert due_for_check(held, now=60.0, grace_seconds=60.0) == ["old"]


def test_pinned_bytes_count_deleted_inputs_once() -> None:
    held = [_held("b1", file_id="gone"), _held("b2", file_id="gone"), _held("b3", file_id="kept")]
    assert pinned_bytes(held, {"kept"}) == 100
    assert pinned_bytes(held, {"kept", "gone"}) == 0


def test_a_released_batch_is_refused_when_its_update_comes_late() -> None:
    """The api answered a create 503 when no worker answered, and released its batch id: the
    update, decided once a worker polls again, must not take a slot for a batch never started."""
    released = frozenset(remember_released([], "late"))
    refused = decide([], _req("late", max_active_batches=5), released)
    assert not refused.accepted and refused.refused_by == "released" and refused.active == 0
    assert decide([], _req("other", max_active_batches=5), released).accepted


def test_released_ids_are_bounded_and_newest_kept() -> None:
    released: list[str] = []
    for i in range(RELEASED_KEPT + 5):
        released = remember_released(released, f"b{i}")
    assert len(released) == RELEASED_KEPT
    assert released[0] == "b5" and released[-1] == f"b{RELEASED_KEPT + 4}"
    assert remember_released(released, "b5")[-1] == "b5"


def test_a_check_frees_an_ended_batch_however_young_and_keeps_one_not_started() -> None:
    from backfill.tenancy.admission import to_drop

    held = [
        Reservation(batch_id="ended", input_file_id="f", input_bytes=1, lines=1, reserved_at=95),
        Reservation(batch_id="starting", input_file_id="f", input_bytes=1, lines=1, reserved_at=95),
        Reservation(batch_id="lost", input_file_id="f", input_bytes=1, lines=1, reserved_at=0),
    ]
    # At 100 s: `ended` ran and closed 5 s after its reservation; `starting` is not known to
    # Temporal yet (its api is starting it); `lost` was never started and is past the grace.
    dropped = to_drop(
        held,
        closed=["ended", "starting", "lost"],
        missing=["starting", "lost"],
        now=100,
        grace_seconds=60,
    )
    assert dropped == ["ended", "lost"]
