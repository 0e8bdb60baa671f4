"""Webhook activities: hand a batch's event to its delivery workflow (`announce_webhook_event`)
and make one delivery attempt (`deliver_webhook`). Secrets are computed here, from the
environment, at each attempt: never an input, an output or a log line.

A delivery attempt is one POST with no retry (the workflow retries, on its schedule): the URL's
host is resolved once and every address checked against the destination policy
(`backfill.webhooks.events.refusal`), then the connection goes only to the addresses that passed
(pinned with `backfill.upstream.load_reader.PinnedBackend`, TLS still verifying the host name), with
no redirect followed, no proxy, a deadline of `timeout_seconds` for the whole attempt, and at most
`MAX_RESPONSE_BYTES` of the answer read.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import time
from datetime import timedelta

import httpcore
from temporalio import activity
from temporalio.client import Client
from temporalio.common import (
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError

from backfill.batches import search_attributes as sa
from backfill.platform import refs
from backfill.platform.config import Settings, configured_endpoints
from backfill.upstream.load_reader import PinnedBackend, Resolver, resolve_host
from backfill.webhooks.endpoint_reads import endpoints_made
from backfill.webhooks.events import (
    AnnounceInput,
    AnnounceOutput,
    AttemptInput,
    AttemptOutcome,
    DeliveryPlan,
    EventInput,
    EventType,
    RetryPlan,
    WebhookEndpoint,
    WebhookTarget,
    check_url,
    delivery_url,
    derive_secret,
    event_workflow_id,
    refusal,
    signed_headers,
    signing_rotations,
)

MAX_RESPONSE_BYTES = 64 * 1024
"""The most of a receiver's answer read (the rest is ignored; only the status matters)."""
USER_AGENT = b"backfill-webhooks"
ENDPOINT_READ_TIMEOUT = timedelta(seconds=2)
"""How long an attempt waits for the endpoints workflow's answer (its current rotation)."""


class _Refused(Exception):
    """The destination is refused by the policy: trying again will not help."""


class WebhookActivities:
    def __init__(self, settings: Settings, client: Client, resolve: Resolver = resolve_host):
        self.settings = settings
        self.client = client
        self._resolve = resolve

    @activity.defn
    async def announce_webhook_event(self, input: AnnounceInput) -> AnnounceOutput:
        """Start the event's `WebhookEventWorkflow` with where it goes, unless no endpoint is
        subscribed to it. Never twice for one event: its workflow id is the event's and reusing
        it is refused, also after the first ended (a second announce is a no-op)."""
        plan = await self._plan(input.workspace, input.event.type)
        if not plan.targets:
            return AnnounceOutput(targets=0)
        try:
            await self.client.start_workflow(
                refs.WebhookEventWorkflow.run,
                EventInput(event=input.event, workspace=input.workspace, plan=plan),
                id=event_workflow_id(input.event.id),
                task_queue=self.settings.task_queue,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                search_attributes=TypedSearchAttributes(
                    [
                        SearchAttributePair(sa.WORKSPACE, input.workspace),
                        SearchAttributePair(sa.CREATED_AT, input.event.created_at),
                    ]
                ),
            )
        except WorkflowAlreadyStartedError:
            activity.logger.info("webhook event %s was already announced", input.event.id)
        return AnnounceOutput(targets=len(plan.targets))

    async def _plan(self, workspace: str, type: EventType) -> DeliveryPlan:
        """The workspace's endpoints subscribed to the event (configured, then made through
        the api) and the configured retry schedule."""
        s = self.settings
        configured = configured_endpoints(s, workspace)
        endpoints = configured + await self._api_endpoints(workspace)
        return DeliveryPlan(
            targets=[
                WebhookTarget(
                    endpoint_id=e.id, url=e.url, rotation=e.rotation, secret_env=e.secret_env
                )
                for e in endpoints
                if type in e.event_types
            ],
            retry=RetryPlan(
                initial_seconds=s.webhook_retry_initial_seconds,
                max_interval_seconds=s.webhook_retry_max_interval_seconds,
                give_up_after_seconds=s.webhook_retry_for_seconds,
            ),
            attempt_timeout_seconds=s.webhook_timeout_seconds,
        )

    async def _api_endpoints(self, workspace: str) -> list[WebhookEndpoint]:
        return await endpoints_made(self.client, workspace)

    @activity.defn
    async def deliver_webhook(self, input: AttemptInput) -> AttemptOutcome:
        """One signed POST of the event to the target; never raises for the receiver's faults
        (they are the outcome), so the workflow logs every attempt. Without a signing secret
        the delivery fails at once (`permanent`): no later attempt would have one."""
        secrets = await self._secrets(input)
        if not secrets:
            return AttemptOutcome(
                delivered=False, error=self._no_secret(input.target), permanent=True
            )
        body = input.event.body()
        try:
            async with asyncio.timeout(input.timeout_seconds):
                status = await self._post(input.target.url, secrets, input, body)
        except _Refused as e:
            return AttemptOutcome(delivered=False, error=str(e), permanent=True)
        except TimeoutError:
            return AttemptOutcome(
                delivered=False, error=f"no answer within {input.timeout_seconds:g} s"
            )
        except (httpcore.ConnectError, httpcore.ConnectTimeout, OSError) as e:
            return AttemptOutcome(delivered=False, error=f"cannot connect: {e or type(e).__name__}")
        except Exception as e:  # protocol errors, resets: the receiver's fault, tried again
            return AttemptOutcome(delivered=False, error=f"{type(e).__name__}: {e}")
        if 200 <= status < 300:
            return AttemptOutcome(delivered=True, status_code=status)
        why = "redirects are not followed" if 300 <= status < 400 else "not a 2xx answer"
        return AttemptOutcome(delivered=False, status_code=status, error=why)

    async def _secrets(self, input: AttemptInput) -> list[str]:
        """The secrets this attempt signs with (none: there is no secret to sign with). An
        endpoint made through the api signs with its current secret, and with the previous one
        too during the grace period after a rotation (`signing_rotations`): the endpoint is read
        now, not when the event was raised, so an event raised before a rotation reaches a
        receiver that already switched."""
        target = input.target
        if target.secret_env is not None:
            secret = os.environ.get(target.secret_env)
            return [secret] if secret else []
        key = self.settings.webhook_key
        if not key:
            return []
        endpoint = await self._current_endpoint(input.workspace, target)
        rotations = signing_rotations(
            endpoint, time.time(), self.settings.webhook_rotation_grace_seconds
        )
        return [derive_secret(key, input.workspace, target.endpoint_id, r) for r in rotations]

    async def _current_endpoint(self, workspace: str, target: WebhookTarget) -> WebhookEndpoint:
        """The endpoint as its workflow holds it now; as the event found it when it was removed
        since, or its workflow does not answer (logged)."""
        as_raised = WebhookEndpoint(id=target.endpoint_id, url=target.url, rotation=target.rotation)
        try:
            endpoints = await endpoints_made(self.client, workspace, ENDPOINT_READ_TIMEOUT)
        except RPCError as err:
            activity.logger.warning(
                "signing with the rotation the event found: endpoints of %s unread: %s",
                workspace,
                err,
            )
            return as_raised
        return next((e for e in endpoints if e.id == target.endpoint_id), as_raised)

    @staticmethod
    def _no_secret(target: WebhookTarget) -> str:
        name = target.secret_env or "BACKFILL_WEBHOOK_KEY"
        return (
            f"no signing secret: the worker's environment variable {name} is not set; "
            "the event is not delivered (set it on every worker, then events raised later are)"
        )

    async def _post(self, url: str, secrets: list[str], input: AttemptInput, body: bytes) -> int:
        try:
            _, host, port = check_url(url)
            url = delivery_url(url)
        except ValueError as e:
            raise _Refused(str(e)) from None
        pins = {(host, port): await self._allowed_addresses(host, port)}
        headers = [
            (b"Content-Type", b"application/json"),
            (b"User-Agent", USER_AGENT),
            *(
                (k.encode(), v.encode())
                for k, v in signed_headers(secrets, input.event, int(time.time()), body).items()
            ),
        ]
        timeouts = {k: input.timeout_seconds for k in ("connect", "read", "write", "pool")}
        async with (
            httpcore.AsyncConnectionPool(
                network_backend=PinnedBackend(pins), retries=0, max_connections=1
            ) as pool,
            pool.stream(
                "POST", url, headers=headers, content=body, extensions={"timeout": timeouts}
            ) as response,
        ):
            read = 0
            async for chunk in response.aiter_stream():
                read += len(chunk)
                if read >= MAX_RESPONSE_BYTES:
                    break
            return response.status

    async def _allowed_addresses(self, host: str, port: int) -> list[str]:
        """The host's addresses, resolved once for this attempt; refused if any is refused
        (a name that resolves to a public and a private address is not sent to either)."""
        try:
            addresses = [str(ipaddress.ip_address(host.strip("[]")))]
        except ValueError:
            addresses = await self._resolve(host, port)
        if not addresses:
            raise OSError(f"cannot resolve {host}")
        allowed = self.settings.webhook_destinations
        for address in addresses:
            why = refusal(host, address, allowed)
            if why is not None:
                raise _Refused(why)
        return addresses
