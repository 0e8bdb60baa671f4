"""Webhooks end to end: an admin makes endpoints through the api, batches reach terminal
statuses, and a receiver on loopback (allow-listed) verifies every event with the openai SDK's
`webhooks.unwrap`; a receiver answering 500 twice gets the event once more, same id; a worker
killed mid-delivery still delivers. Retries are seconds apart here (the settings), not minutes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
from openai.types.webhooks import WebhookEndpointWithSecret

from backfill.webhooks.events import event_id
from tests.e2e.conftest import MakeStack
from tests.e2e.stack import Stack, submit, wait_terminal
from tests.polling import poll_until
from tools.sim import SimConfig, SimServer

ADMIN = "sk-test-admin"
FAST_RETRIES = {
    "BACKFILL_WEBHOOK_KEY": "e2e-master-key-0123456789abcdef0123456789",
    "BACKFILL_WEBHOOK_ALLOWED_DESTINATIONS": "127.0.0.1",
    "BACKFILL_WEBHOOK_RETRY_INITIAL_SECONDS": "0.5",
    "BACKFILL_WEBHOOK_RETRY_MAX_INTERVAL_SECONDS": "1",
    "BACKFILL_WEBHOOK_TIMEOUT_SECONDS": "2",
}

WEBHOOK_STACK: dict[str, Any] = {
    "extra_env": FAST_RETRIES,
    "sim": SimConfig(model_names=[], latency_ms=5),
}
"""The webhook tests' stack: a lease of the shared one of these options, or a test's own
where its worker processes are the subject (killed, or started without the key)."""


@dataclass
class Receiver:
    """An ASGI receiver: records each request; answers `script`'s statuses first, then 200;
    `hold` (if set) keeps the first request waiting until released."""

    script: list[int] = field(default_factory=list)
    hold: asyncio.Event | None = None
    received: list[tuple[bytes, dict[str, str]]] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        self.received.append((body, headers))
        self.arrived.set()
        if self.hold is not None and len(self.received) == 1:
            await self.hold.wait()
        status = self.script.pop(0) if self.script else 200
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    def events(self, secret: str) -> list[Any]:
        """Every request, verified and parsed by the SDK (raises on a bad signature)."""
        hooks = openai.OpenAI(api_key="unused").webhooks
        return [hooks.unwrap(body, headers, secret=secret) for body, headers in self.received]


async def serve(receiver: Receiver) -> SimServer:
    server = SimServer(SimConfig(model_names=[]))
    server.app = receiver  # type: ignore[assignment]
    await server.start()
    return server


def hooks_url(stack: Stack, ws: str) -> str:
    return f"{stack.api_url}/api/v1/workspaces/{stack.workspaces[ws]}/webhooks"


async def make_endpoint(stack: Stack, ws: str, url: str) -> WebhookEndpointWithSecret:
    async with httpx.AsyncClient(headers=stack.auth(ADMIN)) as http:
        r = await http.post(hooks_url(stack, ws), json={"url": url, "name": "test"})
    assert r.status_code == 200, r.text
    return WebhookEndpointWithSecret.model_validate(r.json())


async def deliveries(stack: Stack, ws: str, key: str) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(headers=stack.auth(key)) as http:
        r = await http.get(hooks_url(stack, ws) + "/deliveries")
    assert r.status_code == 200, r.text
    data: list[dict[str, Any]] = r.json()["data"]
    return data


async def until(probe: Callable[[], Awaitable[Any]], done: Callable[[Any], bool], what: str) -> Any:
    return await poll_until(probe, done, timeout=120, what=what, interval=0.25)


async def test_events_verify_with_the_sdk_and_a_flaky_receiver_gets_one_more(
    lease_stack: MakeStack,
) -> None:
    stack = await lease_stack(**WEBHOOK_STACK)
    ok, flaky = Receiver(), Receiver(script=[500, 500])
    servers = [await serve(ok), await serve(flaky)]
    try:
        endpoint = await make_endpoint(stack, "alpha", f"{servers[0].url}/hooks")
        flaky_endpoint = await make_endpoint(stack, "beta", f"{servers[1].url}/hooks")
        assert endpoint.signing_secret.startswith("whsec_")
        assert endpoint.event_types == [
            "batch.completed",
            "batch.failed",
            "batch.expired",
            "batch.cancelled",
        ]

        # The workspace's member reads its endpoints (never a secret), not another's.
        async with httpx.AsyncClient(headers=stack.auth("sk-test-alpha")) as http:
            listed = (await http.get(hooks_url(stack, "alpha"))).json()["data"]
            assert [e["id"] for e in listed] == [endpoint.id]
            assert "signing_secret" not in listed[0]
            assert listed[0]["signing_secret_hint"] == endpoint.signing_secret_hint
            assert (await http.get(hooks_url(stack, "beta"))).status_code == 404
            made = await http.post(hooks_url(stack, "alpha"), json={"url": "https://x.example"})
            assert made.status_code == 403, made.text
        async with httpx.AsyncClient(headers=stack.auth(ADMIN)) as http:
            private = await http.post(hooks_url(stack, "alpha"), json={"url": "http://10.0.0.1/"})
            assert private.status_code == 400, private.text
            assert private.json()["error"]["code"] == "destination_refused"

        # completed, failed (rejected input) and cancelled: one verified event each
        client = stack.client()
        completed = await submit(stack, 3)
        bad = await client.files.create(file=("bad.jsonl", b"not json\n"), purpose="batch")
        failed = await client.batches.create(
            input_file_id=bad.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        assert (await wait_terminal(client, completed)).status == "completed"
        assert (await wait_terminal(client, failed.id)).status == "failed"
        await until(lambda: asyncio.sleep(0, len(ok.received)), lambda n: n >= 2, "2 events")
        got = {e.data.id: e for e in ok.events(endpoint.signing_secret)}
        assert got[completed].type == "batch.completed"
        assert got[completed].id == event_id(completed, "batch.completed")
        assert got[failed.id].type == "batch.failed"
        assert got[failed.id].id == event_id(failed.id, "batch.failed")
        assert all(
            h["webhook-id"] == json.loads(body)["id"] and h["content-type"] == "application/json"
            for body, h in ok.received
        )

        log = await until(
            lambda: deliveries(stack, "alpha", "sk-test-alpha"),
            lambda d: (
                len(d) == 2 and all(t["state"] == "delivered" for e in d for t in e["targets"])
            ),
            "the delivery log to show both delivered",
        )
        assert {e["event"]["batch_id"] for e in log} == {completed, failed.id}
        assert log[0]["targets"][0]["last_attempts"][-1]["status_code"] == 200

        # 500, 500, then 200: the same event three times, the same id, nothing after.
        beta = await submit(stack, 2, key="sk-test-beta")
        await wait_terminal(stack.client("sk-test-beta"), beta)
        [entry] = await until(
            lambda: deliveries(stack, "beta", "sk-test-beta"),
            lambda d: len(d) == 1 and d[0]["targets"][0]["state"] == "delivered",
            "the flaky receiver's event to be delivered",
        )
        events = flaky.events(flaky_endpoint.signing_secret)
        assert [e.id for e in events] == [event_id(beta, "batch.completed")] * 3
        attempts = entry["targets"][0]["last_attempts"]
        assert [a["status_code"] for a in attempts] == [500, 500, 200]
        assert attempts[0]["next_retry_at"] is not None and attempts[-1]["next_retry_at"] is None
    finally:
        for server in servers:
            await server.stop()


async def test_a_worker_killed_mid_delivery_still_delivers(make_stack: MakeStack) -> None:
    stack = await make_stack(**WEBHOOK_STACK)
    receiver = Receiver(hold=asyncio.Event())
    server = await serve(receiver)
    try:
        endpoint = await make_endpoint(stack, "alpha", f"{server.url}/hooks")
        batch_id = await submit(stack, 2)
        await wait_terminal(stack.client(), batch_id)
        await asyncio.wait_for(receiver.arrived.wait(), 120)  # the first attempt, held
        stack.workers[-1].kill()
        stack.start_worker()
        assert receiver.hold is not None
        receiver.hold.set()  # its answer goes to a dead worker
        [entry] = await until(
            lambda: deliveries(stack, "alpha", "sk-test-alpha"),
            lambda d: len(d) == 1 and d[0]["targets"][0]["state"] == "delivered",
            "delivery after the worker's death",
        )
        ids = {e.id for e in receiver.events(endpoint.signing_secret)}
        assert ids == {event_id(batch_id, "batch.completed")}
        assert len(receiver.received) >= 2
        attempts = entry["targets"][0]["last_attempts"]
        assert attempts[0]["error"].startswith("attempt lost"), attempts
        assert attempts[-1]["status_code"] == 200
    finally:
        await server.stop()
