"""workflows.run_length: when a batch's run continues as new (pure, no server)."""

from __future__ import annotations

from workflows.run_length import MAX_RUN_EVENTS, MAX_RUN_HISTORY_BYTES, run_is_full


def test_temporal_s_suggestion_is_followed() -> None:
    assert run_is_full(suggested=True, events=10, size_bytes=1000)


def test_without_a_suggestion_a_run_goes_on_below_both_bounds() -> None:
    assert not run_is_full(
        suggested=False, events=MAX_RUN_EVENTS - 1, size_bytes=MAX_RUN_HISTORY_BYTES - 1
    )


def test_either_bound_ends_a_run_without_a_suggestion() -> None:
    assert run_is_full(suggested=False, events=MAX_RUN_EVENTS, size_bytes=0)
    assert run_is_full(suggested=False, events=0, size_bytes=MAX_RUN_HISTORY_BYTES)


def test_the_bounds_sit_under_temporal_s_warnings_and_far_under_its_limits() -> None:
    """Temporal warns at 10,240 events or 10 MB and terminates a run at 51,200 events or 50 MB;
    a drain at cap 256 adds about 1,000 events and 1 MB, finalizing a few."""
    assert MAX_RUN_EVENTS <= 10_240 and MAX_RUN_HISTORY_BYTES <= 10 * 2**20
    assert MAX_RUN_EVENTS + 2_000 < 51_200
    assert MAX_RUN_HISTORY_BYTES + 2 * 2**20 < 50 * 2**20
