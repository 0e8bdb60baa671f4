"""The typed references in backfill.platform.refs name exactly what the real workflows define."""

from __future__ import annotations

import inspect
from typing import Any, get_type_hints

import pytest
from temporalio import workflow

from backfill.platform import refs
from backfill.routes.gates import registry
from workflows.admission import AdmissionWorkflow
from workflows.batch import BatchWorkflow
from workflows.scheduler import RouteSchedulerWorkflow
from workflows.webhooks import WebhookEndpointsWorkflow, WebhookEventWorkflow


def _shape(cls: type) -> dict[str, Any]:
    defn = workflow._Definition.must_from_class(cls)
    hints = {name: get_type_hints(getattr(cls, name)) for name in ("run",)}
    handlers: dict[str, Any] = {}
    for kind, table in (
        ("signal", defn.signals),
        ("query", defn.queries),
        ("update", defn.updates),
    ):
        for name, d in table.items():
            fn = d.fn
            params = list(inspect.signature(fn).parameters.values())[1:]
            hints_fn = get_type_hints(fn)
            handlers[name] = (
                kind,
                [(p.name, hints_fn.get(p.name), p.default) for p in params],
                hints_fn.get("return"),
            )
    return {"name": defn.name, "run": hints["run"], "handlers": handlers}


@pytest.mark.parametrize(
    "ref,real",
    [
        (refs.BatchWorkflow, BatchWorkflow),
        (refs.RouteSchedulerWorkflow, RouteSchedulerWorkflow),
        (refs.AdmissionWorkflow, AdmissionWorkflow),
        (refs.WebhookEndpointsWorkflow, WebhookEndpointsWorkflow),
        (refs.WebhookEventWorkflow, WebhookEventWorkflow),
    ],
)
def test_ref_matches_the_workflow(ref: type, real: type) -> None:
    expected = _shape(ref)
    actual = _shape(real)
    if real is RouteSchedulerWorkflow:
        # The gates' signals reach the scheduler's one dynamic handler (None); each one the
        # ref declares is a gate's, with the gate's payload type.
        assert actual["handlers"].pop(None)[0] == "signal"
        for name in [n for n in expected["handlers"] if registry.signal(str(n))]:
            kind, params, _ = expected["handlers"].pop(name)
            found = registry.signal(name)
            assert found is not None and kind == "signal"
            assert [p[1] for p in params] == [found[1].payload], name
    assert expected == actual


def test_every_gate_signal_is_declared_for_callers() -> None:
    declared = set(workflow._Definition.must_from_class(refs.RouteSchedulerWorkflow).signals)
    gate_signals = {s.name for e in registry.entries() for s in e.signals}
    assert gate_signals == {"report_live", "rate_limited", "report_held_back", "server_load"}
    assert gate_signals <= declared


def test_handler_names_are_the_ones_running_workflows_know() -> None:
    assert set(workflow._Definition.must_from_class(refs.BatchWorkflow).signals) == {
        "set_allotment",
        "pause",
        "resume",
        "cancel",
    }
    assert refs.signal_name(refs.RouteSchedulerWorkflow.demand) == "demand"
    assert refs.signal_name(refs.BatchWorkflow.set_allotment) == "set_allotment"
