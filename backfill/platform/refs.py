"""Typed references to our workflows, for code that must not import the workflow modules.

The api, the activities and each workflow talking to the other start, signal, query and update
workflows through these classes: `client.start_workflow(refs.BatchWorkflow.run, ...)`,
`handle.signal(refs.RouteSchedulerWorkflow.ack, ...)`. Each class carries the workflow's
type name and the name and types of every run method, signal, query and update, and nothing else:
no state, no behaviour (the bodies are never called), so importing it imports no workflow code and
no cycle can form. `tests/unit/test_refs.py` checks each against the real workflow class.

Rule: `activities/` and `api/` import `backfill.platform.messages`, `backfill.platform.refs` and
pure modules, never `workflows.batch` or `workflows.scheduler` (docs/decisions/0008).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from temporalio import workflow

from backfill.batches.batch import Batch
from backfill.platform.messages import (
    Ack,
    Allotment,
    BatchInput,
    Demand,
    LiveGateView,
    PauseRequest,
    SchedulerInput,
)
from backfill.routes.gates.backoff import RateLimited
from backfill.routes.gates.live import LiveReport
from backfill.routes.gates.seats import HeldBackReport
from backfill.routes.gates.server_load import LoadVerdict
from backfill.routes.settings import ConfiguredSettings, RouteSettings
from backfill.routes.status import SchedulerStatus
from backfill.tenancy.admission import (
    AdmissionInput,
    AdmissionView,
    ReleaseRequest,
    ReserveRequest,
    ReserveResult,
)
from backfill.webhooks.events import (
    EndpointId,
    EndpointsInput,
    EventDeliveries,
    EventInput,
    WebhookEndpoint,
)


@workflow.defn(name="BatchWorkflow")
class BatchWorkflow:
    """workflows.batch.BatchWorkflow: one OpenAI batch (workflow id = batch id)."""

    @workflow.run
    async def run(self, input: BatchInput) -> Batch:
        raise NotImplementedError

    @workflow.signal
    def set_allotment(self, a: Allotment) -> None:
        raise NotImplementedError

    @workflow.signal
    def pause(self, req: PauseRequest | None = None) -> None:
        raise NotImplementedError

    @workflow.signal
    def resume(self) -> None:
        raise NotImplementedError

    @workflow.signal
    def cancel(self) -> None:
        raise NotImplementedError

    @workflow.update
    def cancel_now(self) -> Batch:
        raise NotImplementedError

    @workflow.query
    def describe(self) -> Batch:
        raise NotImplementedError


@workflow.defn(name="RouteSchedulerWorkflow")
class RouteSchedulerWorkflow:
    """workflows.scheduler.RouteSchedulerWorkflow: one per route (id from
    `backfill.platform.ids.scheduler_workflow_id`)."""

    @workflow.run
    async def run(self, input: SchedulerInput) -> None:
        raise NotImplementedError

    @workflow.signal
    def demand(self, d: Demand) -> None:
        raise NotImplementedError

    @workflow.signal
    def ack(self, a: Ack) -> None:
        raise NotImplementedError

    @workflow.signal
    def report_live(self, r: LiveReport) -> None:
        raise NotImplementedError

    @workflow.signal
    def rate_limited(self, r: RateLimited) -> None:
        raise NotImplementedError

    @workflow.signal
    def report_held_back(self, r: HeldBackReport) -> None:
        raise NotImplementedError

    @workflow.signal
    def server_load(self, v: LoadVerdict) -> None:
        raise NotImplementedError

    @workflow.signal
    def configure(self, c: ConfiguredSettings) -> None:
        raise NotImplementedError

    @workflow.query
    def live_gate(self) -> LiveGateView:
        raise NotImplementedError

    @workflow.update
    def set_settings(self, settings: RouteSettings) -> RouteSettings:
        raise NotImplementedError

    @workflow.query
    def status(self, at: float | None = None) -> SchedulerStatus:
        raise NotImplementedError


@workflow.defn(name="WebhookEndpointsWorkflow")
class WebhookEndpointsWorkflow:
    """workflows.webhooks.WebhookEndpointsWorkflow: a workspace's webhook endpoints (id from
    `backfill.webhooks.events.endpoints_workflow_id`)."""

    @workflow.run
    async def run(self, input: EndpointsInput) -> None:
        raise NotImplementedError

    @workflow.update
    def add(self, endpoint: WebhookEndpoint) -> WebhookEndpoint:
        raise NotImplementedError

    @workflow.update
    def remove(self, ref: EndpointId) -> WebhookEndpoint:
        raise NotImplementedError

    @workflow.update
    def rotate(self, ref: EndpointId) -> WebhookEndpoint:
        raise NotImplementedError

    @workflow.query
    def endpoints(self) -> list[WebhookEndpoint]:
        raise NotImplementedError


@workflow.defn(name="WebhookEventWorkflow")
class WebhookEventWorkflow:
    """workflows.webhooks.WebhookEventWorkflow: one event's deliveries (id from
    `backfill.webhooks.events.event_workflow_id`)."""

    @workflow.run
    async def run(self, input: EventInput) -> EventDeliveries:
        raise NotImplementedError

    @workflow.query
    def deliveries(self) -> EventDeliveries:
        raise NotImplementedError


def signal_name(signal: Callable[..., Any]) -> str:
    """The name of a signal given by method reference (for `start_signal`, which takes a name)."""
    return workflow._SignalDefinition.must_name_from_fn_or_str(signal)


@workflow.defn(name="AdmissionWorkflow")
class AdmissionWorkflow:
    """workflows.admission.AdmissionWorkflow: one per workspace (id from
    `backfill.tenancy.admission.admission_workflow_id`)."""

    @workflow.run
    async def run(self, input: AdmissionInput) -> None:
        raise NotImplementedError

    @workflow.update
    def reserve(self, req: ReserveRequest) -> ReserveResult:
        raise NotImplementedError

    @workflow.signal
    def release(self, req: ReleaseRequest) -> None:
        raise NotImplementedError

    @workflow.query
    def holdings(self) -> AdmissionView:
        raise NotImplementedError
