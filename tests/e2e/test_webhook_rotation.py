"""Webhooks, round three, end to end (issue 40): an event pending when its endpoint's secret is
rotated reaches a receiver that switched to the new secret at once (both signatures during the
grace period), and a worker without `BACKFILL_WEBHOOK_KEY` fails the delivery at once, saying
why, instead of retrying for 72 hours."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx
import openai

from backfill.webhooks.events import event_id
from tests.e2e.conftest import MakeStack
from tests.e2e.stack import submit, wait_terminal
from tests.e2e.test_webhooks import (
    ADMIN,
    WEBHOOK_STACK,
    deliveries,
    hooks_url,
    make_endpoint,
    serve,
    until,
)
from tests.polling import poll_until


@dataclass
class SwitchingReceiver:
    """Answers 503 until it is given a secret, then 200 to what verifies with it and 400 to
    the rest, as a receiver checking signatures does."""

    secret: str | None = None
    received: list[tuple[bytes, dict[str, str], int]] = field(default_factory=list)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        status = 503
        if self.secret is not None:
            try:
                openai.OpenAI(api_key="unused").webhooks.unwrap(body, headers, secret=self.secret)
                status = 200
            except openai.InvalidWebhookSignatureError:
                status = 400
        self.received.append((body, headers, status))
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b""})


async def test_a_pending_event_reaches_a_receiver_that_switched_after_a_rotation(
    lease_stack: MakeStack,
) -> None:
    stack = await lease_stack(**WEBHOOK_STACK)
    receiver = SwitchingReceiver()
    server = await serve(receiver)  # type: ignore[arg-type]
    try:
        endpoint = await make_endpoint(stack, "alpha", f"{server.url}/hooks")
        batch_id = await submit(stack, 2)
        await wait_terminal(stack.client(), batch_id)
        await until(
            lambda: deliveries(stack, "alpha", "sk-test-alpha"),
            lambda d: len(d) == 1 and d[0]["targets"][0]["attempts"] >= 1,
            "the event's first attempt (answered 503)",
        )
        async with httpx.AsyncClient(headers=stack.auth(ADMIN)) as http:
            r = await http.post(f"{hooks_url(stack, 'alpha')}/{endpoint.id}/rotate_secret")
        assert r.status_code == 200, r.text
        new_secret = r.json()["signing_secret"]
        assert new_secret != endpoint.signing_secret
        receiver.secret = new_secret  # the receiver switches at once

        [entry] = await until(
            lambda: deliveries(stack, "alpha", "sk-test-alpha"),
            lambda d: d[0]["targets"][0]["state"] != "pending",
            "the pending event delivered with the new secret",
        )
        assert entry["targets"][0]["state"] == "delivered", entry
        body, headers, status = receiver.received[-1]
        assert status == 200
        hooks = openai.OpenAI(api_key="unused").webhooks
        # Signed during the grace period: with the old secret too, for receivers not yet switched.
        for secret in (new_secret, endpoint.signing_secret):
            assert hooks.unwrap(body, headers, secret=secret).id == event_id(
                batch_id, "batch.completed"
            )
    finally:
        await server.stop()


async def test_a_worker_without_the_key_fails_the_delivery_at_once(make_stack: MakeStack) -> None:
    stack = await make_stack(**WEBHOOK_STACK)
    receiver = SwitchingReceiver(secret="unused")
    server = await serve(receiver)  # type: ignore[arg-type]
    try:
        await make_endpoint(stack, "alpha", f"{server.url}/hooks")
        for worker in stack.workers:  # the api has the key; the worker that signs does not
            worker.stop()
        stack.start_worker({"BACKFILL_WEBHOOK_KEY": ""})
        batch_id = await poll_until(  # 503 until the new worker answers the admission
            lambda: submit(stack, 2),
            timeout=60,
            what="a batch created once the new worker polls",
            interval=0.5,
            ignore=(openai.InternalServerError,),
        )
        await wait_terminal(stack.client(), batch_id)
        [entry] = await until(
            lambda: deliveries(stack, "alpha", "sk-test-alpha"),
            lambda d: len(d) == 1 and d[0]["targets"][0]["state"] != "pending",
            "the delivery to end",
        )
        target = entry["targets"][0]
        assert target["state"] == "failed" and target["attempts"] == 1, target
        [attempt] = target["last_attempts"]
        assert "BACKFILL_WEBHOOK_KEY" in attempt["error"] and attempt["next_retry_at"] is None
        assert receiver.received == []  # nothing unsigned was sent
    finally:
        await server.stop()
