"""Unit tests for workflows.fairness (pure functions, no server)."""

from __future__ import annotations

import random

import pytest

from workflows.fairness import Claim, Holding, fair_shares, fairness_order, plan_step


def claim(
    batch_id: str, workspace: str, wanted: int, running: int = 0, last_served: int = 0
) -> Claim:
    return Claim(batch_id, workspace, wanted, running, last_served)


def ws_totals(claims: list[Claim], shares: dict[str, int]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for c in claims:
        totals[c.workspace] = totals.get(c.workspace, 0) + shares[c.batch_id]
    return totals


def slot_by_slot(cap: int, claims: list[Claim]) -> dict[str, int]:
    """Reference: hand out one slot at a time as the design describes (fewest allotted first,
    ties by running, then least recently served, then name), workspaces first, then batches."""
    groups: dict[str, list[Claim]] = {}
    for c in claims:
        groups.setdefault(c.workspace, []).append(c)

    def ws_key(name: str) -> tuple[int, int, str]:
        members = groups[name]
        return (sum(c.running for c in members), max(c.last_served for c in members), name)

    def fill(total: int, items: list, demand, key) -> dict:  # type: ignore[no-untyped-def]
        got = {item: 0 for item in items}
        for _ in range(total):
            open_items = [i for i in items if got[i] < demand(i)]
            if not open_items:
                break
            best = min(open_items, key=lambda i: (got[i], key(i)))
            got[best] += 1
        return got

    ws_share = fill(cap, list(groups), lambda w: sum(max(c.wanted, 0) for c in groups[w]), ws_key)
    result: dict[str, int] = {}
    for name, members in groups.items():
        got = fill(
            ws_share[name],
            members,
            lambda c: max(c.wanted, 0),
            lambda c: (c.running, c.last_served, c.batch_id),
        )
        result.update({c.batch_id: n for c, n in got.items()})
    return result


# --------------------------------------------------------------------------- fair_shares


@pytest.mark.parametrize(("cap", "wanted"), [(10, 3), (10, 10), (10, 500), (1, 1), (7, 0)])
def test_single_batch_gets_min_of_cap_and_wanted(cap: int, wanted: int) -> None:
    assert fair_shares(cap, [claim("b", "w", wanted)]) == {"b": min(cap, wanted)}


def test_two_workspaces_split_evenly() -> None:
    claims = [claim("a", "wa", 1000), claim("b", "wb", 1000)]
    assert fair_shares(10, claims) == {"a": 5, "b": 5}
    # Two batches in one workspace do not double that workspace's share.
    claims.append(claim("a2", "wa", 1000))
    shares = fair_shares(10, claims)
    assert ws_totals(claims, shares) == {"wa": 5, "wb": 5}
    assert shares["a"] + shares["a2"] == 5 and abs(shares["a"] - shares["a2"]) == 1


def ten_small_and_one_huge() -> list[Claim]:
    # Small batches s0..s9: s0..s4 have 1 line running, s5..s9 none; within each half the
    # least recently served is the highest index.
    small = [claim(f"s{i}", "small", 100, i < 5, 100 - i) for i in range(10)]
    return [claim("huge", "big", 100_000, 5, 1), *small]


def small_priority() -> list[str]:
    # fewest running first, then least recently served
    return [f"s{i}" for i in range(9, 4, -1)] + [f"s{i}" for i in range(4, -1, -1)]


@pytest.mark.parametrize("cap", [4, 10, 256])
def test_huge_batch_cannot_starve_ten_small_batches(cap: int) -> None:
    claims = ten_small_and_one_huge()
    shares = fair_shares(cap, claims)
    assert ws_totals(claims, shares) == {"big": cap // 2, "small": cap // 2}
    base, extra = divmod(cap // 2, 10)
    expected = {b: base + (1 if rank < extra else 0) for rank, b in enumerate(small_priority())}
    assert {b: n for b, n in shares.items() if b != "huge"} == expected
    assert shares["huge"] == cap // 2
    assert shares == slot_by_slot(cap, claims)


def test_surplus_of_small_workspace_goes_to_others() -> None:
    claims = [claim("a", "wa", 2), claim("b", "wb", 100)]
    assert fair_shares(10, claims) == {"a": 2, "b": 8}
    claims = [claim("a", "wa", 1), claim("b", "wb", 3), claim("c", "wc", 100), claim("d", "wd", 4)]
    assert fair_shares(12, claims) == {"a": 1, "b": 3, "c": 4, "d": 4}
    assert fair_shares(20, claims) == {"a": 1, "b": 3, "c": 12, "d": 4}


def test_batch_never_gets_more_than_wanted() -> None:
    claims = [claim("x", "w", 1), claim("y", "w", 2), claim("z", "w", 50), claim("o", "v", 3)]
    shares = fair_shares(40, claims)
    assert shares == {"x": 1, "y": 2, "z": 34, "o": 3}
    shares = fair_shares(1000, claims)
    assert shares == {"x": 1, "y": 2, "z": 50, "o": 3}


def test_remainder_workspace_tie_break_running_then_last_served_then_name() -> None:
    # one slot, three workspaces: fewest running wins even if served more recently
    claims = [claim("a", "wa", 9, 2, 1), claim("b", "wb", 9, 1, 50), claim("c", "wc", 9, 3, 0)]
    assert fair_shares(1, claims) == {"a": 0, "b": 1, "c": 0}
    # running ties: least recently served (max last_served over the workspace's batches) wins
    claims = [
        claim("a1", "wa", 9, 1, 1),
        claim("a2", "wa", 9, 0, 30),
        claim("b", "wb", 9, 1, 20),
        claim("c", "wc", 9, 2, 0),
    ]
    shares = fair_shares(1, claims)
    assert shares["b"] == 1 and sum(shares.values()) == 1
    # everything ties: workspace name decides
    claims = [claim("b1", "wz", 9), claim("b2", "wa", 9), claim("b3", "wm", 9)]
    assert fair_shares(2, claims) == {"b1": 0, "b2": 1, "b3": 1}


def test_remainder_batch_tie_break_running_then_last_served_then_id() -> None:
    claims = [
        claim("p", "w", 9, 1, 0),
        claim("q", "w", 9, 0, 7),
        claim("r", "w", 9, 0, 3),
        claim("t", "w", 9, 0, 3),
        claim("s", "w", 9, 0, 3),
    ]
    # order: r, s, t (running 0, served 3, by id), then q (served 7), then p (running 1)
    assert fair_shares(1, claims) == {"p": 0, "q": 0, "r": 1, "s": 0, "t": 0}
    assert fair_shares(3, claims) == {"p": 0, "q": 0, "r": 1, "s": 1, "t": 1}
    assert fair_shares(4, claims) == {"p": 0, "q": 1, "r": 1, "s": 1, "t": 1}
    assert fair_shares(9, claims) == {"p": 1, "q": 2, "r": 2, "s": 2, "t": 2}


def test_cap_zero_and_negative_wanted() -> None:
    claims = [claim("a", "wa", 5), claim("b", "wb", -3), claim("c", "wa", 0)]
    assert fair_shares(0, claims) == {"a": 0, "b": 0, "c": 0}
    assert fair_shares(10, claims) == {"a": 5, "b": 0, "c": 0}
    assert fair_shares(10, []) == {}


def random_claims(rng: random.Random) -> list[Claim]:
    claims = []
    for i in range(rng.randint(0, 25)):
        wanted = rng.choice([rng.randint(-2, 5), rng.randint(0, 40), rng.randint(0, 100_000)])
        claims.append(
            claim(f"b{i}", f"w{rng.randint(0, 5)}", wanted, rng.randint(0, 6), rng.randint(0, 9))
        )
    return claims


def test_random_sum_bounds_and_fairness() -> None:
    for seed in range(400):
        rng = random.Random(seed)
        claims = random_claims(rng)
        cap = rng.choice([0, 1, rng.randint(0, 30), rng.randint(0, 2000)])
        shares = fair_shares(cap, claims)
        total = sum(max(c.wanted, 0) for c in claims)
        assert set(shares) == {c.batch_id for c in claims}, seed
        assert sum(shares.values()) == min(cap, total), seed
        for c in claims:
            assert 0 <= shares[c.batch_id] <= max(c.wanted, 0), seed
        # max-min: an unsatisfied workspace never trails another workspace by more than 1
        ws_share = ws_totals(claims, shares)
        ws_want: dict[str, int] = {}
        for c in claims:
            ws_want[c.workspace] = ws_want.get(c.workspace, 0) + max(c.wanted, 0)
        for w, got in ws_share.items():
            if got < ws_want[w]:
                assert all(other <= got + 1 for other in ws_share.values()), seed
        # same inside every workspace
        for c in claims:
            if shares[c.batch_id] < max(c.wanted, 0):
                peers = [shares[p.batch_id] for p in claims if p.workspace == c.workspace]
                assert max(peers) <= shares[c.batch_id] + 1, seed
        # deterministic and independent of input order
        shuffled = claims[:]
        rng.shuffle(shuffled)
        assert fair_shares(cap, shuffled) == shares, seed
        if cap <= 300:
            assert shares == slot_by_slot(cap, claims), seed


# --------------------------------------------------------------------------- fairness_order


def test_fairness_order_matches_remainder_rule() -> None:
    claims = [
        claim("a1", "wa", 9, 2, 5),
        claim("a2", "wa", 9, 0, 1),
        claim("b1", "wb", 9, 1, 9),
        claim("b2", "wb", 9, 1, 2),
        claim("c1", "wc", 9, 1, 3),
    ]
    # workspaces: wc (running 1, served 3), wb (2, 9), wa (2, 5) -> wc, wa, wb
    assert fairness_order(claims) == ["c1", "a2", "a1", "b2", "b1"]
    # the first batches of the order are exactly the ones a 1-slot-per-workspace split serves
    shares = fair_shares(3, claims)
    assert {b for b, n in shares.items() if n} == {"c1", "a2", "b2"}


# --------------------------------------------------------------------------- plan_step


def test_plan_step_shrink_then_raise_in_order() -> None:
    holdings = [Holding("a", 6, 6), Holding("b", 2, 2)]
    step = plan_step(10, {"a": 3, "b": 5, "c": 4}, holdings, ["c", "b", "a"])
    # a shrinks to 3 but still holds 6; only 2 slots free; c is first in order and takes them
    assert step.allotments == {"a": 3, "b": 2, "c": 2}
    assert step.held == {"a": 6, "b": 2, "c": 2}
    assert step.raised == ["c"]
    # a acknowledges its shrink: 3 slots free; c takes 2 more, b the last one
    acked = [Holding(b, step.allotments[b], step.allotments[b]) for b in step.allotments]
    step = plan_step(10, {"a": 3, "b": 5, "c": 4}, acked, ["c", "b", "a"])
    assert step.allotments == {"a": 3, "b": 3, "c": 4}
    assert step.held == {"a": 3, "b": 3, "c": 4}
    assert step.raised == ["c", "b"]


def test_plan_step_regrow_into_own_held_slots_is_free() -> None:
    # a shrank to 2 but still holds 5 (unacked); its target goes back up to 5 with no free slots
    step = plan_step(8, {"a": 5, "b": 3}, [Holding("a", 2, 5), Holding("b", 3, 3)], ["a", "b"])
    assert step.allotments == {"a": 5, "b": 3}
    assert step.held == {"a": 5, "b": 3}
    assert step.raised == ["a"]


def test_plan_step_lowered_cap_blocks_raises_until_back_within() -> None:
    holdings = [Holding("a", 5, 5), Holding("b", 5, 5), Holding("c", 0, 0)]
    targets = {"a": 2, "b": 2, "c": 2}
    step = plan_step(6, targets, holdings, ["c", "a", "b"])
    assert step.raised == []
    assert step.allotments == {"a": 2, "b": 2, "c": 0}
    assert step.held == {"a": 5, "b": 5, "c": 0}
    # a acks (held 2+5 = 7 > 6): still over the cap, still no raise, not even re-growing
    holdings = [Holding("a", 2, 2), Holding("b", 2, 5), Holding("c", 0, 0)]
    step = plan_step(6, {"a": 2, "b": 5, "c": 2}, holdings, ["b", "c", "a"])
    assert step.raised == []
    assert step.allotments == {"a": 2, "b": 2, "c": 0}
    # b acks too: 4 held, 2 free -> c is raised
    holdings = [Holding("a", 2, 2), Holding("b", 2, 2), Holding("c", 0, 0)]
    step = plan_step(6, targets, holdings, ["c", "a", "b"])
    assert step.raised == ["c"]
    assert step.allotments == {"a": 2, "b": 2, "c": 2}
    assert sum(step.held.values()) == 6


def test_plan_step_unknown_batches_and_missing_targets() -> None:
    # new batch starts at 0/0; a holding without a target shrinks to 0 (keeps held); a batch
    # missing from `order` is still raised after the ordered ones
    step = plan_step(10, {"new": 3, "x": 4}, [Holding("gone", 4, 4)], ["new"])
    assert step.allotments == {"gone": 0, "new": 3, "x": 3}
    assert step.held == {"gone": 4, "new": 3, "x": 3}
    assert step.raised == ["new", "x"]


def test_plan_step_random_sequence_never_exceeds_cap() -> None:
    for seed in range(200):
        rng = random.Random(seed)
        ids = [f"b{i}" for i in range(rng.randint(1, 12))]
        cap = rng.randint(0, 40)
        holdings = {b: Holding(b, 0, 0) for b in ids}
        for _ in range(60):
            if rng.random() < 0.15:
                cap = max(0, cap + rng.randint(-15, 10))  # cap lowered (or raised)
            claims = [
                claim(
                    b, f"w{rng.randint(0, 3)}", rng.randint(0, 20), h.allotment, rng.randint(0, 9)
                )
                for b, h in holdings.items()
            ]
            if rng.random() < 0.5:
                targets = fair_shares(cap, claims)
            else:
                targets = {b: rng.randint(0, 25) for b in ids}  # arbitrary, even > cap
            order = fairness_order(claims)
            before = sum(h.held for h in holdings.values())
            step = plan_step(cap, targets, list(holdings.values()), order)
            after = sum(step.held.values())
            if before <= cap:
                assert after <= cap, seed
            else:
                assert step.raised == [], seed
                assert after == before, seed
            for b in ids:
                old = holdings[b]
                new_allot, new_held = step.allotments[b], step.held[b]
                assert new_allot <= new_held, seed
                assert new_held >= old.held, seed  # held only drops on acknowledgement
                assert (new_allot > old.allotment) == (b in step.raised), seed
                if new_allot > old.allotment:
                    assert new_allot <= targets[b], seed
                else:
                    assert new_allot == min(old.allotment, targets[b]), seed
            # randomly acknowledge some shrinks
            holdings = {
                b: Holding(
                    b,
                    step.allotments[b],
                    step.allotments[b] if rng.random() < 0.5 else step.held[b],
                )
                for b in ids
            }
        # with all shrinks acknowledged and targets fitting, allotments converge to the targets
        targets = fair_shares(cap, [claim(b, "w", 5) for b in ids])
        for _ in range(2):  # 1st step shrinks (maybe blocked raises), 2nd raises after acks
            step = plan_step(cap, targets, list(holdings.values()), ids)
            holdings = {b: Holding(b, step.allotments[b], step.allotments[b]) for b in ids}
        assert {b: h.allotment for b, h in holdings.items()} == targets, seed


# ---- workspace share weights ----


def weighted(batch_id: str, workspace: str, wanted: int, weight: int) -> Claim:
    return Claim(batch_id, workspace, wanted, 0, 0, weight)


def test_weights_split_the_cap_in_proportion() -> None:
    claims = [weighted("a", "big", 100, 3), weighted("b", "small", 100, 1)]
    assert fair_shares(8, claims) == {"a": 6, "b": 2}


def test_a_weighted_workspace_wanting_less_leaves_the_rest() -> None:
    claims = [weighted("a", "big", 2, 3), weighted("b", "small", 100, 1)]
    assert fair_shares(8, claims) == {"a": 2, "b": 6}


def test_weight_is_per_workspace_not_per_batch() -> None:
    claims = [
        weighted("a1", "big", 100, 2),
        weighted("a2", "big", 100, 2),
        weighted("b", "small", 100, 1),
    ]
    shares = fair_shares(9, claims)
    assert ws_totals(claims, shares) == {"big": 6, "small": 3}
    assert shares["a1"] + shares["a2"] == 6 and abs(shares["a1"] - shares["a2"]) <= 1


@pytest.mark.parametrize("seed", range(200))
def test_weighted_shares_are_max_min_fair(seed: int) -> None:
    """Random instances: the sum is min(cap, total wanted), nobody gets more than it wants, and
    a workspace held below its demand has its weighted share of what the others got, to the
    rounding of one slot each way: for workspaces i (short of its demand) and j,
    (share_i + 1) / w_i >= (share_j - 1) / w_j."""
    rng = random.Random(seed)
    names = [f"w{i}" for i in range(rng.randint(1, 5))]
    weights = {n: rng.randint(1, 5) for n in names}
    claims = [
        weighted(f"{n}-{k}", n, rng.randint(0, 30), weights[n])
        for n in names
        for k in range(rng.randint(1, 3))
    ]
    cap = rng.randint(0, 60)
    shares = fair_shares(cap, claims)
    wanted = {n: sum(c.wanted for c in claims if c.workspace == n) for n in names}
    got = ws_totals(claims, shares)
    assert sum(got.values()) == min(cap, sum(wanted.values()))
    for n in names:
        assert 0 <= got[n] <= wanted[n]
    for i in names:
        if got[i] >= wanted[i]:
            continue
        for j in names:
            assert (got[i] + 1) * weights[j] >= (got[j] - 1) * weights[i], (i, j, got, weights)


@pytest.mark.parametrize("seed", range(100))
def test_unit_weights_change_nothing(seed: int) -> None:
    rng = random.Random(seed)
    claims = [
        claim(f"b{i}", f"w{rng.randint(0, 3)}", rng.randint(0, 20), rng.randint(0, 5), i)
        for i in range(rng.randint(1, 8))
    ]
    cap = rng.randint(0, 40)
    assert fair_shares(cap, claims) == slot_by_slot(cap, claims)
