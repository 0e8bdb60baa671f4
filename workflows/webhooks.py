"""Webhook workflows (docs/decisions/0021).

- `WebhookEndpointsWorkflow`, one per workspace: its endpoints made through the api (URL, event
  types, name, rotation count; never a secret, which is derived). Changed by updates, read by a
  query; it runs until Temporal suggests continuing as new.
- `WebhookEventWorkflow`, one per event with somewhere to go (id from the event id, so starting
  it twice is harmless), started by the `announce_webhook_event` activity with the endpoints
  subscribed to the event: delivers to each until it answers 2xx, with the configured back-off
  for up to 72 h. Its delivery log (last attempts, their status or error, the next retry) is its
  query, its result and its memo, which the api reads without a worker.
- `announce`: how a batch that reached a terminal status hands its event over. The event
  workflow is not the batch's child: it runs on its own, so a receiver never delays the batch.

Timing decisions (`next_attempt_at`) are in `backfill.webhooks.events`; all I/O is in
`activities.webhooks`.
"""

from __future__ import annotations

import asyncio
import math
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from activities.webhooks import WebhookActivities
    from backfill.batches.batch import Batch
    from backfill.batches.lifecycle import STAMPS
    from backfill.webhooks.events import (
        DELIVERIES_MEMO,
        MAX_ENDPOINTS,
        AnnounceInput,
        AttemptInput,
        AttemptOutcome,
        AttemptRecord,
        DeliveryPlan,
        DeliveryState,
        EndpointId,
        EndpointsInput,
        EventDeliveries,
        EventInput,
        TargetLog,
        WebhookEndpoint,
        WebhookEvent,
        WebhookTarget,
        event_type_for,
        next_attempt_at,
    )

ANNOUNCE_FOR = timedelta(hours=1)
"""How long a batch keeps trying to hand its event over before it closes without it."""
ATTEMPT_GRACE = timedelta(seconds=5)
"""Beyond the attempt's own deadline before its activity counts as lost (its worker died)."""


class EndpointNotFound(ApplicationError):
    def __init__(self, endpoint_id: str) -> None:
        super().__init__(f"No such webhook endpoint: {endpoint_id}", type="not_found")


@workflow.defn
class WebhookEndpointsWorkflow:
    @workflow.init
    def __init__(self, input: EndpointsInput) -> None:
        self._s = input.model_copy(deep=True)

    @workflow.run
    async def run(self, input: EndpointsInput) -> None:
        await workflow.wait_condition(lambda: workflow.info().is_continue_as_new_suggested())
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.continue_as_new(self._s)

    @workflow.update
    def add(self, endpoint: WebhookEndpoint) -> WebhookEndpoint:
        now = int(workflow.now().timestamp())
        made = endpoint.model_copy(update={"created_at": now, "updated_at": now, "rotation": 0})
        self._s.endpoints.append(made)
        return made

    @add.validator
    def _may_add(self, endpoint: WebhookEndpoint) -> None:
        if any(e.id == endpoint.id for e in self._s.endpoints):
            raise ApplicationError(f"Endpoint {endpoint.id} exists.", type="conflict")
        if len(self._s.endpoints) >= MAX_ENDPOINTS:
            raise ApplicationError(
                f"A workspace has at most {MAX_ENDPOINTS} webhook endpoints.", type="too_many"
            )

    @workflow.update
    def remove(self, ref: EndpointId) -> WebhookEndpoint:
        found = self._find(ref.id)
        self._s.endpoints.remove(found)
        return found

    @workflow.update
    def rotate(self, ref: EndpointId) -> WebhookEndpoint:
        found = self._find(ref.id)
        found.rotation += 1
        found.updated_at = found.rotated_at = int(workflow.now().timestamp())
        return found

    @remove.validator
    def _may_remove(self, ref: EndpointId) -> None:
        self._find(ref.id)

    @rotate.validator
    def _may_rotate(self, ref: EndpointId) -> None:
        self._find(ref.id)

    @workflow.query
    def endpoints(self) -> list[WebhookEndpoint]:
        return self._s.endpoints

    def _find(self, endpoint_id: str) -> WebhookEndpoint:
        for e in self._s.endpoints:
            if e.id == endpoint_id:
                return e
        raise EndpointNotFound(endpoint_id)


@workflow.defn
class WebhookEventWorkflow:
    @workflow.init
    def __init__(self, input: EventInput) -> None:
        self._d = EventDeliveries(event=input.event, workspace=input.workspace)

    @workflow.run
    async def run(self, input: EventInput) -> EventDeliveries:
        plan = input.plan
        self._d.targets = [TargetLog(endpoint_id=t.endpoint_id, url=t.url) for t in plan.targets]
        self._show()
        await asyncio.gather(
            *(
                self._deliver(t, log, plan)
                for t, log in zip(plan.targets, self._d.targets, strict=True)
            )
        )
        return self._d

    @workflow.query
    def deliveries(self) -> EventDeliveries:
        return self._d

    async def _deliver(self, target: WebhookTarget, log: TargetLog, plan: DeliveryPlan) -> None:
        """Attempts until one is answered 2xx, the destination is refused, or the plan ends."""
        first_at = workflow.now().timestamp()
        while True:
            started = workflow.now().timestamp()
            outcome = await self._attempt(target, plan)
            now = workflow.now().timestamp()
            retry_at = None
            if not outcome.delivered and not outcome.permanent:
                retry_at = next_attempt_at(log.attempts + 1, first_at, now, plan.retry)
            state: DeliveryState = (
                "delivered" if outcome.delivered else "pending" if retry_at else "failed"
            )
            log.record(
                AttemptRecord(
                    at=int(started),
                    status_code=outcome.status_code,
                    error=outcome.error,
                    next_retry_at=math.ceil(retry_at) if retry_at is not None else None,
                ),
                state,
            )
            self._show()
            if retry_at is None:
                return
            await workflow.sleep(max(retry_at - now, 0.001))

    async def _attempt(self, target: WebhookTarget, plan: DeliveryPlan) -> AttemptOutcome:
        try:
            return await workflow.execute_activity_method(
                WebhookActivities.deliver_webhook,
                AttemptInput(
                    event=self._d.event,
                    workspace=self._d.workspace,
                    target=target,
                    timeout_seconds=plan.attempt_timeout_seconds,
                ),
                start_to_close_timeout=timedelta(seconds=plan.attempt_timeout_seconds)
                + ATTEMPT_GRACE,
                retry_policy=RetryPolicy(maximum_attempts=1),  # the schedule is ours
            )
        except ActivityError as err:  # its worker died or it crashed: an attempt like others
            return AttemptOutcome(delivered=False, error=f"attempt lost: {err.cause or err}")

    def _show(self) -> None:
        workflow.upsert_memo({DELIVERIES_MEMO: self._d.model_dump(mode="json")})


async def announce(batch: Batch, workspace: str) -> None:
    """Hand the event of the batch's terminal status to its delivery workflow
    (`announce_webhook_event`: one short call to Temporal, retried for up to an hour; after
    that the batch closes without its event, logged)."""
    type = event_type_for(batch.status)
    if type is None:
        return
    at = getattr(batch, STAMPS[batch.status]) or int(workflow.now().timestamp())
    event = WebhookEvent.for_batch(batch.id, type, at)
    try:
        await workflow.execute_activity_method(
            WebhookActivities.announce_webhook_event,
            AnnounceInput(event=event, workspace=workspace),
            start_to_close_timeout=timedelta(seconds=30),
            schedule_to_close_timeout=ANNOUNCE_FOR,
            retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=30)),
        )
    except ActivityError as err:
        workflow.logger.error("webhook event %s not announced: %s", event.id, err.cause or err)
