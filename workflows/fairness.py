"""Fair sharing of a route's concurrency cap between workspaces and batches.

Pure and deterministic (standard library only, no I/O, no clock, no randomness): it is called
from inside the route scheduler workflow.

``fair_shares`` computes target allotments: a weighted max-min fair (water-filling) split of the
cap across workspaces (each workspace's share in proportion to its share weight, equal by
default), then an even one across the batches of each workspace, never more than a batch still
wants. Slots that cannot be split evenly go one each to the workspace / batch with the fewest
lines running, then the one served least recently, then the smallest name.

``deadline_shares`` is ``fair_shares`` with deadlines heeded inside each workspace: a batch whose
fair share cannot finish its lines before its ``expires_at`` (at the pace its lines have taken)
is given, earliest deadline first, the slots it needs to finish in time out of what the other
batches can spare; the rest of the workspace's share is split as before. Workspaces' shares are
unchanged (docs/decisions/0038).

``plan_step`` moves current allotments toward those targets without ever letting the slots held
exceed the cap: shrinks keep their slots held until the batch acknowledges them, raises only use
free slots.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

__all__ = [
    "Claim",
    "Holding",
    "Step",
    "deadline_shares",
    "fair_shares",
    "fairness_order",
    "plan_step",
    "slots_to_finish",
]

_Key = tuple[int, int, str]


@dataclass(frozen=True)
class Claim:
    batch_id: str
    """Batch this demand belongs to (unique within one call)."""
    workspace: str
    """Workspace that owns the batch; the cap is shared across workspaces first."""
    wanted: int
    """Lines the batch still wants running at most (pending + running); negative counts as 0."""
    running: int
    """Lines it runs now (as last known); fewer running wins remainder slots."""
    last_served: int
    """Sequence number of the batch's last allotment increase; 0 = never. Smaller wins ties."""
    weight: int = 1
    """Share weight of the batch's workspace (>= 1; if its batches disagree, the largest)."""
    expires_at: float | None = None
    """When the batch expires (Unix seconds); None: no deadline to heed."""
    line_seconds: float | None = None
    """Seconds one of its lines holds a slot, as its lines have taken so far (None or <= 0:
    not known yet, so its deadline cannot be judged and it keeps its fair share)."""


@dataclass(frozen=True)
class Holding:
    batch_id: str
    """Batch the slots belong to."""
    allotment: int
    """Current allotment given to the batch."""
    held: int
    """Slots counted as used by the batch: >= allotment while a shrink is unacknowledged."""


@dataclass(frozen=True)
class Step:
    allotments: dict[str, int]
    """New allotment of every batch (in targets or holdings), changed or not."""
    held: dict[str, int]
    """New held count of every batch; sum stays <= cap whenever the input's did."""
    raised: list[str]
    """Batch ids whose allotment went up, in raise order (the caller bumps their last_served)."""


def _water_fill(
    total: int, demands: list[int], keys: list[_Key], weights: list[int] | None = None
) -> list[int]:
    """Weighted max-min fair split of ``total`` over ``demands`` (each share in proportion to its
    weight, default 1); leftover slots by ascending ``keys``. With equal weights this is the
    plain even split."""
    priority = keys.__getitem__
    weight = [max(w, 1) for w in weights] if weights is not None else [1] * len(demands)
    shares = [0] * len(demands)
    left = max(total, 0)
    pending = sorted(
        range(len(demands)), key=lambda i: (Fraction(demands[i], weight[i]), priority(i))
    )
    for pos, i in enumerate(pending):
        rest_weight = sum(weight[j] for j in pending[pos:])
        share = left * weight[i] // rest_weight
        if demands[i] <= share:
            shares[i] = demands[i]
            left -= demands[i]
            continue
        # Every remaining demand exceeds its weighted share (they are sorted by demand per
        # weight): give each its share, and one more slot to the first leftovers by priority
        # (each can take it: demand >= share + 1; fewer leftovers than remaining demands).
        rest = sorted(pending[pos:], key=priority)
        for j in rest:
            shares[j] = left * weight[j] // rest_weight
        extra = left - sum(shares[j] for j in rest)
        for rank, j in enumerate(rest):
            shares[j] += 1 if rank < extra else 0
        break
    return shares


def _group(claims: Sequence[Claim]) -> dict[str, list[Claim]]:
    groups: dict[str, list[Claim]] = {}
    for claim in claims:
        groups.setdefault(claim.workspace, []).append(claim)
    return groups


def _ws_key(name: str, members: list[Claim]) -> _Key:
    """Workspace priority: running total, then most recent service of any batch, then name."""
    return (
        sum(max(c.running, 0) for c in members),
        max(c.last_served for c in members),
        name,
    )


def _batch_key(claim: Claim) -> _Key:
    return (max(claim.running, 0), claim.last_served, claim.batch_id)


def fair_shares(cap: int, claims: Sequence[Claim]) -> dict[str, int]:
    """Target allotment per batch_id: max-min fair split of ``cap`` across workspaces (weighted by
    their share weights), then across
    batches within each workspace; never more than a batch's ``wanted``; the sum is
    ``min(cap, total wanted)``; every batch_id in claims appears in the result (0 allowed)."""
    groups = _group(claims)
    names = sorted(groups)
    ws_keys = [_ws_key(name, groups[name]) for name in names]
    ws_demand = [sum(max(c.wanted, 0) for c in groups[name]) for name in names]
    ws_weight = [max(c.weight for c in groups[name]) for name in names]
    ws_share = _water_fill(cap, ws_demand, ws_keys, ws_weight)
    result: dict[str, int] = {}
    for name, share in zip(names, ws_share, strict=True):
        members = groups[name]
        demands = [max(c.wanted, 0) for c in members]
        keys = [_batch_key(c) for c in members]
        for claim, got in zip(members, _water_fill(share, demands, keys), strict=True):
            result[claim.batch_id] = got
    return result


def slots_to_finish(claim: Claim, now: float) -> int | None:
    """The fewest slots with which the batch's ``wanted`` lines all end by its ``expires_at``,
    lines taking ``line_seconds`` each and running in rounds (with s slots, ceil(wanted / s)
    rounds); ``wanted`` itself when fewer than one round fits before the deadline (no share is
    enough). None when it cannot be judged: no deadline, no known pace, or nothing wanted."""
    wanted = max(claim.wanted, 0)
    if claim.expires_at is None or not claim.line_seconds or claim.line_seconds <= 0:
        return None
    if wanted == 0:
        return None
    rounds = int((claim.expires_at - now) // claim.line_seconds)
    if rounds <= 0:
        return wanted
    return -(-wanted // rounds)


def deadline_shares(cap: int, claims: Sequence[Claim], now: float) -> dict[str, int]:
    """``fair_shares`` with deadlines heeded within each workspace, as of ``now`` (Unix seconds).

    A batch is at risk when its fair share is below ``slots_to_finish``: at that share it cannot
    finish before it expires. In a workspace with a batch at risk, each batch not at risk first
    keeps the slots it needs to finish in time (never more than its fair share, so they always
    fit); then the batches at risk take, by earliest ``expires_at`` (then the fair remainder
    order), the slots they need out of what is left, as far as it goes; the rest is split fairly
    over every batch's remaining demand. So a batch at risk takes only what others can spare, and
    none is pushed at risk by it. A workspace without a batch at risk keeps its fair split, and
    each workspace's total is its fair share: across workspaces the weighted fair share holds."""
    fair = fair_shares(cap, claims)
    result = dict(fair)
    for members in _group(claims).values():
        needs = {c.batch_id: slots_to_finish(c, now) for c in members}
        at_risk = [
            c for c in members if (n := needs[c.batch_id]) is not None and fair[c.batch_id] < n
        ]
        if not at_risk:
            continue
        risky = {c.batch_id for c in at_risk}
        given = {c.batch_id: 0 if c.batch_id in risky else needs[c.batch_id] or 0 for c in members}
        left = sum(fair[c.batch_id] for c in members) - sum(given.values())
        for c in sorted(at_risk, key=lambda c: (c.expires_at or 0.0, _batch_key(c))):
            take = min(needs[c.batch_id] or 0, max(c.wanted, 0), left)
            given[c.batch_id] = take
            left -= take
        rest = [max(c.wanted, 0) - given[c.batch_id] for c in members]
        split = _water_fill(left, rest, [_batch_key(c) for c in members])
        for c, extra in zip(members, split, strict=True):
            result[c.batch_id] = given[c.batch_id] + extra
    return result


def fairness_order(claims: Sequence[Claim]) -> list[str]:
    """Batch ids in the order raises are applied, consistent with the remainder rule: workspace
    (running total, last served, name) ascending, then batch (running, last_served, id)."""
    groups = _group(claims)
    ws_keys = {name: _ws_key(name, members) for name, members in groups.items()}
    ordered = sorted(claims, key=lambda c: (ws_keys[c.workspace], _batch_key(c)))
    return [c.batch_id for c in ordered]


def plan_step(
    cap: int, targets: dict[str, int], holdings: Sequence[Holding], order: Sequence[str]
) -> Step:
    """Move allotments toward ``targets`` without letting ``sum(held)`` exceed ``cap``.

    Shrinks apply at once but keep their slots held (the caller lowers ``held`` on ack). Raises
    then use the free slots (``cap - sum(held)``) in ``order``; a batch may first re-grow into
    slots it still holds at no cost. If the holdings already exceed the cap, nothing is raised.
    Batches in ``targets`` without a holding start at 0/0; holdings without a target get target
    0; batches needing a raise but missing from ``order`` come after it, by id."""
    allot: dict[str, int] = {}
    held: dict[str, int] = {}
    for h in holdings:
        allot[h.batch_id] = max(h.allotment, 0)
        held[h.batch_id] = max(h.held, allot[h.batch_id])
    for batch_id in targets:
        allot.setdefault(batch_id, 0)
        held.setdefault(batch_id, 0)
    want = {batch_id: max(targets.get(batch_id, 0), 0) for batch_id in allot}
    for batch_id, target in want.items():
        if target < allot[batch_id]:
            allot[batch_id] = target
    free = max(cap, 0) - sum(held.values())
    raised: list[str] = []
    if free >= 0:
        seen: dict[str, None] = {}
        for batch_id in order:
            if batch_id in allot:
                seen.setdefault(batch_id, None)
        sequence = list(seen) + sorted(b for b in allot if b not in seen)
        for batch_id in sequence:
            target = want[batch_id]
            if target <= allot[batch_id]:
                continue
            new = min(target, held[batch_id] + free)
            if new <= allot[batch_id]:
                continue
            free -= max(new - held[batch_id], 0)
            held[batch_id] = max(held[batch_id], new)
            allot[batch_id] = new
            raised.append(batch_id)
    return Step(allotments=allot, held=held, raised=raised)
