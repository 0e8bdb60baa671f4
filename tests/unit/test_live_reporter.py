"""The live reporter's rule, pure: below the threshold processes stay quiet within their share
of the slack (and then the true sum is below the threshold whatever they do), a crossing is
reported, a drop that reopens the gate is reported, held counts are renewed."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from api.live.reporter import KEEPALIVE_SECONDS, should_report


def report(**kw: object) -> bool:
    args = {"held": 0, "others": 0, "processes": 2, "threshold": 4, "since_sent": 0.0}
    args.update(kw)
    return should_report(**args)  # type: ignore[arg-type]


def test_gate_off_never_reports() -> None:
    assert not report(current=100, threshold=None)


def test_a_process_registers_with_its_first_live_request() -> None:
    assert report(current=1, held=None) and not report(current=0, held=None)


def test_quiet_within_its_share_of_the_slack_below_the_threshold() -> None:
    # threshold 4, nothing held, two processes: each may run (4 - 1 - 0) // 2 = 1 unreported
    assert not report(current=1)
    assert report(current=2)  # past its share: the sum might be crossing


def test_a_drop_that_reopens_the_gate_is_reported_and_others_are_not() -> None:
    assert report(current=1, held=3, others=1)  # 1 + 1 < 4: reopens
    assert not report(current=3, held=4, others=1)  # 3 + 1 >= 4: still closed


def test_held_counts_are_renewed_and_released() -> None:
    assert report(current=3, held=3, others=1, since_sent=KEEPALIVE_SECONDS)
    assert not report(current=3, held=3, others=1, since_sent=1.0)
    assert report(current=0, held=1)  # below the threshold: the reserved room is given back


@settings(max_examples=500, deadline=None)
@given(
    threshold=st.integers(1, 50),
    held=st.lists(st.integers(0, 20), min_size=1, max_size=6),
    data=st.data(),
)
def test_when_no_process_must_report_below_the_threshold_the_true_sum_is_below_it(
    threshold: int, held: list[int], data: st.DataObject
) -> None:
    total = sum(held)
    if total >= threshold:
        return  # the gate is closed: another rule
    currents = [data.draw(st.integers(0, 60)) for _ in held]
    quiet = all(
        not should_report(
            current=c,
            held=h,
            others=total - h,
            processes=len(held),
            threshold=threshold,
            since_sent=0.0,
        )
        for c, h in zip(currents, held, strict=True)
    )
    if quiet:
        assert sum(currents) < threshold
