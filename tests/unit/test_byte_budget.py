"""`backfill.tenancy.byte_budget`: a claim grows within its tenant's share and the process's total,
shrinks and gives everything back; a refusal changes nothing and is counted."""

from __future__ import annotations

from prometheus_client import REGISTRY

from backfill.tenancy.byte_budget import ByteBudget


def _metric(name: str, buffer: str) -> float:
    return REGISTRY.get_sample_value(name, {"buffer": buffer}) or 0.0


def test_a_tenant_cannot_pass_its_share_nor_everyone_the_total() -> None:
    budget = ByteBudget(total=100, share=60, name="unit_test")
    refused_before = _metric("gateway_buffer_refusals_total", "unit_test")
    a1, a2, b, c = (budget.claim(t) for t in ("a", "a", "b", "c"))
    assert a1.resize(40) and not a2.resize(21) and a2.resize(20)  # a: 60 of its 60
    assert a2.size == 20 and budget.held_by("a") == 60
    assert b.resize(40) and not c.resize(1)  # the total: 100 of 100
    assert budget.refusals == 2
    assert _metric("gateway_buffer_refusals_total", "unit_test") == refused_before + 2
    assert _metric("gateway_buffer_bytes", "unit_test") == 100
    assert a1.resize(10) and c.resize(30)  # shrinking gives room back, to anyone
    with b:
        pass  # released on leaving
    a1.release()
    a1.release()  # again: nothing
    a2.release()
    c.release()
    assert budget.held == 0 and budget.held_by("a") == 0
    assert _metric("gateway_buffer_bytes", "unit_test") == 0


def test_a_share_is_at_most_the_total() -> None:
    budget = ByteBudget(total=10, share=50)
    assert budget.share == 10 and not budget.claim("a").resize(11)
