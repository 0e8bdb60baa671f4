"""Unit tests for deadline-aware shares (workflows.fairness.deadline_shares, slots_to_finish):
pure, no server."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from workflows.fairness import Claim, deadline_shares, fair_shares, slots_to_finish

HOUR = 3600.0
NOW = 1_000_000.0


def paced(
    batch_id: str,
    wanted: int,
    *,
    hours_left: float | None,
    line_seconds: float | None = HOUR,
    workspace: str = "w",
    weight: int = 1,
) -> Claim:
    expires_at = None if hours_left is None else NOW + hours_left * HOUR
    return Claim(
        batch_id, workspace, wanted, 0, 0, weight, expires_at=expires_at, line_seconds=line_seconds
    )


def test_slots_to_finish_counts_whole_rounds() -> None:
    # 30 one-hour lines in 24 h: 24 rounds, so 2 slots (1 slot: 30 h)
    assert slots_to_finish(paced("a", 30, hours_left=24), NOW) == 2
    assert slots_to_finish(paced("a", 24, hours_left=24), NOW) == 1
    # 24.9 h still holds only 24 whole rounds
    assert slots_to_finish(paced("a", 25, hours_left=24.9), NOW) == 2
    # less than one line's time left: no share is enough, it wants all it can run
    assert slots_to_finish(paced("a", 7, hours_left=0.5), NOW) == 7
    assert slots_to_finish(paced("a", 7, hours_left=-1), NOW) == 7


def test_slots_to_finish_unknown_without_deadline_pace_or_demand() -> None:
    assert slots_to_finish(paced("a", 30, hours_left=None), NOW) is None
    assert slots_to_finish(paced("a", 30, hours_left=24, line_seconds=None), NOW) is None
    assert slots_to_finish(paced("a", 30, hours_left=24, line_seconds=0.0), NOW) is None
    assert slots_to_finish(paced("a", 0, hours_left=24), NOW) is None


def test_a_24h_batch_behind_a_168h_one_takes_what_it_needs() -> None:
    # cap 2, one-hour lines: fair is 1 + 1, and 30 lines at 1 slot take 30 h > 24 h
    claims = [paced("long", 200, hours_left=167), paced("short", 30, hours_left=24)]
    assert fair_shares(2, claims) == {"long": 1, "short": 1}
    assert deadline_shares(2, claims, NOW) == {"long": 0, "short": 2}


def test_at_risk_batches_take_what_they_need_and_the_rest_is_split_fairly() -> None:
    # cap 10, one-hour lines, 24 h left: 60 lines need 3 slots, the fair 3 (of 4/3/3) suffice
    claims = [
        paced("short", 60, hours_left=24),
        paced("b", 100, hours_left=None),
        paced("c", 100, hours_left=167),
    ]
    assert fair_shares(10, claims) == {"b": 4, "c": 3, "short": 3}
    assert deadline_shares(10, claims, NOW) == fair_shares(10, claims)
    # 120 lines need 5: short takes 5 first, the 5 left go fairly over what each still wants
    claims[0] = paced("short", 120, hours_left=24)
    assert deadline_shares(10, claims, NOW) == {"short": 5 + 1, "b": 2, "c": 2}


def test_earliest_deadline_first_among_those_at_risk() -> None:
    # cap 4: both at risk at a fair 2; the 12 h one needs 3, the 24 h one 3: EDF gives 3, then 1
    claims = [paced("d24", 72, hours_left=24), paced("d12", 36, hours_left=12)]
    assert fair_shares(4, claims) == {"d24": 2, "d12": 2}
    assert deadline_shares(4, claims, NOW) == {"d12": 3, "d24": 1}


def test_a_hopeless_batch_takes_what_others_can_spare() -> None:
    # less than one line's time left: no share makes it; it runs what it can, but "easy" keeps
    # the 1 slot it needs for its 5 lines in 100 h
    claims = [paced("late", 5, hours_left=0.5), paced("easy", 5, hours_left=100)]
    assert deadline_shares(4, claims, NOW) == {"late": 3, "easy": 1}


def test_a_batch_not_at_risk_keeps_what_it_needs() -> None:
    # the 168 h batch (200 lines left in 160 h: 2 slots) is at risk at a fair 1; the 24 h one
    # (16 lines left in 17 h: 1 slot) is not, and keeps its 1 rather than be pushed at risk
    claims = [paced("long", 200, hours_left=160), paced("short", 16, hours_left=17)]
    assert deadline_shares(2, claims, NOW) == {"long": 1, "short": 1}


def test_across_workspaces_the_weighted_fair_share_holds() -> None:
    claims = [
        paced("a-long", 500, hours_left=160, workspace="a", weight=3),
        paced("a-short", 200, hours_left=10, workspace="a", weight=3),
        paced("b-one", 500, hours_left=None, workspace="b"),
    ]
    fair = fair_shares(8, claims)
    aware = deadline_shares(8, claims, NOW)
    assert aware["b-one"] == fair["b-one"] == 2  # workspace b keeps 8 * 1/4
    assert aware["a-short"] == 6 and aware["a-long"] == 0  # a's 6, all to the one at risk


def test_unknown_pace_keeps_the_fair_split() -> None:
    claims = [
        paced("long", 100, hours_left=167),
        paced("short", 30, hours_left=24, line_seconds=None),  # no line has finished yet
    ]
    assert deadline_shares(2, claims, NOW) == fair_shares(2, claims)


def _claims() -> st.SearchStrategy[list[Claim]]:
    one = st.tuples(
        st.integers(-2, 400),  # wanted
        st.sampled_from(["w1", "w2", "w3"]),
        st.integers(1, 4),  # weight (the largest of a workspace counts)
        st.one_of(st.none(), st.floats(-2, 200)),  # hours left
        st.one_of(st.none(), st.floats(1, 7200)),  # line seconds
        st.integers(0, 5),  # running
    )

    def build(rows: list[tuple[int, str, int, float | None, float | None, int]]) -> list[Claim]:
        return [
            Claim(
                f"b{i}",
                ws,
                wanted,
                running,
                0,
                weight,
                expires_at=None if hours is None else NOW + hours * HOUR,
                line_seconds=pace,
            )
            for i, (wanted, ws, weight, hours, pace, running) in enumerate(rows)
        ]

    return st.lists(one, max_size=12).map(build)


@settings(max_examples=300, deadline=None)
@given(cap=st.integers(0, 60), claims=_claims())
def test_deadline_shares_keep_workspace_totals_bounds_and_the_fair_split_when_none_at_risk(
    cap: int, claims: list[Claim]
) -> None:
    fair = fair_shares(cap, claims)
    aware = deadline_shares(cap, claims, NOW)
    assert set(aware) == set(fair)
    for c in claims:
        assert 0 <= aware[c.batch_id] <= max(c.wanted, 0)
    for ws in {c.workspace for c in claims}:
        members = [c for c in claims if c.workspace == ws]
        assert sum(aware[c.batch_id] for c in members) == sum(fair[c.batch_id] for c in members)
        needs = {c.batch_id: slots_to_finish(c, NOW) for c in members}
        at_risk = [
            c for c in members if (n := needs[c.batch_id]) is not None and fair[c.batch_id] < n
        ]
        if not at_risk:
            assert all(aware[c.batch_id] == fair[c.batch_id] for c in members)
            continue
        # a batch not at risk keeps what it needs; the earliest deadline at risk gets all it
        # needs, as far as what the others can spare goes
        kept = 0
        for c in members:
            if c not in at_risk and (n := needs[c.batch_id]) is not None:
                assert aware[c.batch_id] >= n
                kept += n
        first = min(
            at_risk, key=lambda c: (c.expires_at or 0.0, c.running, c.last_served, c.batch_id)
        )
        spare = sum(fair[c.batch_id] for c in members) - kept
        need = needs[first.batch_id] or 0
        assert aware[first.batch_id] >= min(need, max(first.wanted, 0), spare)
