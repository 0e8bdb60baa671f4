"""The typed references in backfill.refs name exactly what the real workflows define."""

from __future__ import annotations

import inspect
from typing import Any, get_type_hints

import pytest
from temporalio import workflow

from backfill import refs
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
    assert _shape(ref) == _shape(real)


def test_handler_names_are_the_ones_running_workflows_know() -> None:
    assert set(workflow._Definition.must_from_class(refs.BatchWorkflow).signals) == {
        "set_allotment",
        "pause",
        "resume",
        "cancel",
    }
    assert refs.signal_name(refs.RouteSchedulerWorkflow.demand) == "demand"
    assert refs.signal_name(refs.BatchWorkflow.set_allotment) == "set_allotment"
