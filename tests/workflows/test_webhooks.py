"""WebhookEventWorkflow on the time-skipping test server, its delivery activity replaced by
name: a receiver down for ten minutes gets the event once after, with the same id, on the
default schedule; a receiver that never recovers is tried for 72 hours and no longer; a refused
destination is not tried again. The endpoints workflow keeps endpoints and refuses unknown ids.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
import pytest_asyncio
from temporalio import activity
from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from backfill.webhooks.events import (
    AttemptInput,
    AttemptOutcome,
    DeliveryPlan,
    EndpointId,
    EndpointsInput,
    EventInput,
    RetryPlan,
    WebhookEndpoint,
    WebhookEvent,
    WebhookTarget,
)
from tests.workflows.test_expiry import time_skipping_env
from workflows.webhooks import WebhookEndpointsWorkflow, WebhookEventWorkflow

pytestmark = pytest.mark.asyncio(loop_scope="session")

OUTAGE_S = 600.0


@dataclass
class Receiver:
    """The fake activities: a receiver that answers 500 until `down_until` (env time)."""

    env: WorkflowEnvironment
    down_until: float = float("inf")
    refused: bool = False
    retry: RetryPlan = field(default_factory=RetryPlan)
    calls: list[tuple[str, float, bool]] = field(default_factory=list)
    """(webhook id, env time, delivered) of each attempt."""

    def plan(self) -> DeliveryPlan:
        target = WebhookTarget(endpoint_id="we_1", url="https://hooks.example.com/in")
        return DeliveryPlan(targets=[target], retry=self.retry)

    @activity.defn(name="deliver_webhook")
    async def deliver(self, input: AttemptInput) -> AttemptOutcome:
        now = (await self.env.get_current_time()).timestamp()
        if self.refused:
            self.calls.append((input.event.id, now, False))
            return AttemptOutcome(delivered=False, error="refused", permanent=True)
        up = now >= self.down_until
        self.calls.append((input.event.id, now, up))
        if up:
            return AttemptOutcome(delivered=True, status_code=200)
        return AttemptOutcome(delivered=False, status_code=500, error="not a 2xx answer")


@dataclass
class Env:
    env: WorkflowEnvironment
    client: Client
    task_queue: str


@pytest_asyncio.fixture(loop_scope="session")
async def ts() -> AsyncIterator[Env]:
    env = await time_skipping_env()
    try:
        yield Env(env, env.client, f"tq-{uuid.uuid4().hex[:6]}")
    finally:
        await env.shutdown()


async def deliver(ts: Env, receiver: Receiver) -> tuple[WebhookEvent, object]:
    event = WebhookEvent.for_batch(f"batch_{uuid.uuid4().hex}", "batch.completed", 1)
    async with Worker(
        ts.client,
        task_queue=ts.task_queue,
        workflows=[WebhookEventWorkflow],
        activities=[receiver.deliver],
    ):
        result = await asyncio.wait_for(
            ts.client.execute_workflow(
                WebhookEventWorkflow.run,
                EventInput(event=event, workspace="w", plan=receiver.plan()),
                id=f"webhook-event:{event.id}",
                task_queue=ts.task_queue,
            ),
            120,
        )
    return event, result


async def test_receiver_down_ten_minutes_gets_the_event_once_after(ts: Env) -> None:
    start = (await ts.env.get_current_time()).timestamp()
    receiver = Receiver(ts.env, down_until=start + OUTAGE_S)
    event, result = await deliver(ts, receiver)
    assert {evt_id for evt_id, _, _ in receiver.calls} == {event.id}  # one webhook-id
    delivered = [t for _, t, ok in receiver.calls if ok]
    assert len(delivered) == 1 and receiver.calls[-1][2], receiver.calls
    failed = [t for _, t, ok in receiver.calls if not ok]
    assert len(failed) >= 5  # retried through the outage, backing off
    gaps = [b - a for a, b in zip(failed, failed[1:], strict=False)]
    assert gaps == sorted(gaps), gaps  # doubling
    late = delivered[0] - (start + OUTAGE_S)
    assert 0 <= late <= OUTAGE_S + 60, late  # on the default schedule: within ~11 min
    log = result.targets[0]  # type: ignore[attr-defined]
    assert log.state == "delivered" and log.attempts == len(receiver.calls)
    assert log.last_attempts[-1].status_code == 200
    assert log.last_attempts[-1].next_retry_at is None
    assert log.last_attempts[-2].status_code == 500 and log.last_attempts[-2].next_retry_at


async def test_a_receiver_that_never_recovers_is_tried_for_72_hours(ts: Env) -> None:
    start = (await ts.env.get_current_time()).timestamp()
    receiver = Receiver(ts.env, retry=RetryPlan(max_interval_seconds=6 * 3600))
    _, result = await deliver(ts, receiver)
    times = [t for _, t, _ in receiver.calls]
    assert times[-1] - start <= 72 * 3600 + 60
    assert times[-1] - start >= 72 * 3600 - 6 * 3600  # the last fits within one interval
    log = result.targets[0]  # type: ignore[attr-defined]
    assert log.state == "failed" and log.attempts == len(times)
    assert log.last_attempts[-1].next_retry_at is None


async def test_a_refused_destination_is_not_tried_again(ts: Env) -> None:
    receiver = Receiver(ts.env, refused=True)
    _, result = await deliver(ts, receiver)
    assert len(receiver.calls) == 1
    assert result.targets[0].state == "failed"  # type: ignore[attr-defined]


async def test_endpoints_workflow_adds_rotates_removes_and_refuses_unknown_ids(ts: Env) -> None:
    async with Worker(ts.client, task_queue=ts.task_queue, workflows=[WebhookEndpointsWorkflow]):
        handle = await ts.client.start_workflow(
            WebhookEndpointsWorkflow.run,
            EndpointsInput(workspace="w"),
            id=f"webhook-endpoints:{uuid.uuid4().hex}",
            task_queue=ts.task_queue,
        )
        made = await handle.execute_update(
            WebhookEndpointsWorkflow.add, WebhookEndpoint(id="we_1", url="https://x.example/")
        )
        assert made.created_at > 0 and made.rotation == 0
        with pytest.raises(WorkflowUpdateFailedError) as dup:
            await handle.execute_update(
                WebhookEndpointsWorkflow.add, WebhookEndpoint(id="we_1", url="https://y.example/")
            )
        assert isinstance(dup.value.cause, ApplicationError) and dup.value.cause.type == "conflict"
        rotated = await handle.execute_update(
            WebhookEndpointsWorkflow.rotate, EndpointId(id="we_1")
        )
        assert rotated.rotation == 1
        with pytest.raises(WorkflowUpdateFailedError) as missing:
            await handle.execute_update(WebhookEndpointsWorkflow.remove, EndpointId(id="we_2"))
        assert isinstance(missing.value.cause, ApplicationError)
        assert missing.value.cause.type == "not_found"
        await handle.execute_update(WebhookEndpointsWorkflow.remove, EndpointId(id="we_1"))
        assert await handle.query(WebhookEndpointsWorkflow.endpoints) == []
        await handle.terminate("test over")
