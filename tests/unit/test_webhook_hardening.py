"""Webhooks, round three (issue 40): a rotation's grace period signs with both secrets, a
missing key fails the delivery at once, the master key has a minimum length at start, IPv6
addresses that carry an IPv4 one are judged by it, IDN hosts are encoded or refused."""

from __future__ import annotations

import asyncio
import base64
import time
from typing import Any

import openai
import pytest
from pydantic import ValidationError

from activities.webhooks import WebhookActivities
from backfill.platform.config import MIN_WEBHOOK_KEY_LENGTH, Settings
from backfill.webhooks.events import (
    AttemptInput,
    Destinations,
    WebhookEndpoint,
    WebhookEvent,
    WebhookTarget,
    check_url,
    derive_secret,
    refusal,
    signed_headers,
    signing_rotations,
)
from tools.sim import SimConfig, SimServer

KEY = "k" * MIN_WEBHOOK_KEY_LENGTH
EVENT = WebhookEvent.for_batch("batch_abc123", "batch.completed", 1_700_000_000)


def _unwrap(headers: dict[str, str], secret: str) -> Any:
    return openai.OpenAI(api_key="unused").webhooks.unwrap(EVENT.body(), headers, secret=secret)


# ---- rotation grace ----------------------------------------------------------------------------
def test_a_rotation_keeps_the_old_secret_for_the_grace_period() -> None:
    rotated = WebhookEndpoint(id="we_1", url="https://x.example/", rotation=3, rotated_at=1000)
    assert signing_rotations(rotated, now=1000 + 3599, grace_seconds=3600) == [3, 2]
    assert signing_rotations(rotated, now=1000 + 3600, grace_seconds=3600) == [3]
    never = WebhookEndpoint(id="we_1", url="https://x.example/")
    assert signing_rotations(never, now=0, grace_seconds=3600) == [0]


def test_both_signatures_verify_with_the_sdk() -> None:
    old, new = (derive_secret(KEY, "w", "we_1", r) for r in (0, 1))
    headers = signed_headers([new, old], EVENT, int(time.time()), EVENT.body())
    assert len(headers["webhook-signature"].split(" ")) == 2
    assert _unwrap(headers, new).id == EVENT.id  # a receiver that switched
    assert _unwrap(headers, old).id == EVENT.id  # one that has not yet
    with pytest.raises(openai.InvalidWebhookSignatureError):
        _unwrap(headers, derive_secret(KEY, "w", "we_1", 2))


class _Endpoints:
    """The endpoints workflow's query, as the delivery activity reads it (no server)."""

    def __init__(self, endpoints: list[WebhookEndpoint]) -> None:
        self.endpoints = endpoints

    def get_workflow_handle_for(self, *_: Any) -> _Endpoints:
        return self

    async def describe(self, *_: Any, **__: Any) -> None:
        return None

    async def query(self, *_: Any, **__: Any) -> list[WebhookEndpoint]:
        return self.endpoints


class _Receiver:
    """An ASGI receiver on loopback: records each request's headers, answers 200."""

    def __init__(self) -> None:
        self.headers: list[dict[str, str]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass
        self.headers.append({k.decode(): v.decode() for k, v in scope["headers"]})
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


async def _serve(receiver: _Receiver) -> SimServer:
    server = SimServer(SimConfig(model_names=[]))
    server.app = receiver  # type: ignore[assignment]
    await server.start()
    return server


async def test_an_event_raised_before_a_rotation_is_signed_with_the_new_secret_too() -> None:
    """The event found rotation 0; the endpoint was rotated since: the attempt reads the
    endpoint now and signs with rotation 1 and, within the grace period, rotation 0."""
    receiver = _Receiver()
    server = await _serve(receiver)
    try:
        now = int(time.time())
        current = WebhookEndpoint(id="we_1", url=server.url, rotation=1, rotated_at=now - 60)
        settings = Settings(webhook_key=KEY, webhook_allowed_destinations="127.0.0.1")
        acts = WebhookActivities(settings, client=_Endpoints([current]))  # type: ignore[arg-type]
        target = WebhookTarget(endpoint_id="we_1", url=server.url, rotation=0)
        out = await acts.deliver_webhook(AttemptInput(event=EVENT, workspace="w", target=target))
        assert out.delivered, out
        [headers] = receiver.headers
        for rotation in (0, 1):
            assert _unwrap(headers, derive_secret(KEY, "w", "we_1", rotation)).id == EVENT.id
        # Past the grace period, only the new secret signs.
        current.rotated_at = now - settings.webhook_rotation_grace_seconds - 1
        assert (
            await acts.deliver_webhook(AttemptInput(event=EVENT, workspace="w", target=target))
        ).delivered
        assert len(receiver.headers[1]["webhook-signature"].split(" ")) == 1
        _unwrap(receiver.headers[1], derive_secret(KEY, "w", "we_1", 1))
    finally:
        await server.stop()


# ---- the master key --------------------------------------------------------------------------
def test_a_short_master_key_is_refused_at_start_without_showing_it() -> None:
    with pytest.raises(ValidationError) as err:
        Settings(webhook_key="e2e-master-key")
    assert "BACKFILL_WEBHOOK_KEY" in str(err.value) and "at least 32" in str(err.value)
    assert Settings(webhook_key="x" * 32).webhook_key == "x" * 32
    assert Settings(webhook_key="").webhook_key == ""  # empty: not set (Helm's unset value)


async def test_a_missing_key_fails_the_delivery_at_once() -> None:
    acts = WebhookActivities(Settings(), client=None)  # type: ignore[arg-type]
    target = WebhookTarget(endpoint_id="we_1", url="https://x.example/")
    out = await acts.deliver_webhook(AttemptInput(event=EVENT, workspace="w", target=target))
    assert not out.delivered and out.permanent
    assert out.error is not None and "BACKFILL_WEBHOOK_KEY" in out.error


# ---- destinations ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("address", "inner"),
    [
        ("64:ff9b::7f00:1", "127.0.0.1"),  # NAT64 (RFC 6052) of loopback
        ("64:ff9b::a9fe:a9fe", "169.254.169.254"),  # NAT64 of the metadata service
        ("64:ff9b::a00:5", "10.0.0.5"),
        ("::7f00:1", "127.0.0.1"),  # IPv4-compatible
        ("::c0a8:1", "192.168.0.1"),
        ("2002:a00:5::1", "10.0.0.5"),  # 6to4
    ],
)
def test_ipv6_carrying_a_private_ipv4_is_refused(address: str, inner: str) -> None:
    why = refusal("hooks.example.com", address, Destinations())
    assert why is not None and inner in why


def test_ipv6_carrying_a_public_ipv4_passes_and_the_allow_list_sees_the_inner_address() -> None:
    assert refusal("x", "64:ff9b::5db8:d822", Destinations()) is None  # 93.184.216.34
    assert refusal("x", "64:ff9b::a00:5", Destinations.parse(["10.0.0.0/8"])) is None
    assert refusal("x", "::1", Destinations()) is not None


def test_idn_hosts_are_encoded_or_refused() -> None:
    assert check_url("https://Bücher.example:8443/hook") == ("https", "xn--bcher-kva.example", 8443)
    for bad in ("https://☃.example/", "https://a\u200d.example/"):
        with pytest.raises(ValueError, match="internationalized"):
            check_url(bad)


async def test_a_delivery_to_an_idn_host_resolves_and_connects_by_its_ascii_name() -> None:
    receiver = _Receiver()
    server = await _serve(receiver)
    asked: list[str] = []

    async def resolve(host: str, port: int) -> list[str]:
        asked.append(host)
        return ["127.0.0.1"] if host == "xn--bcher-kva.test" else []

    try:
        settings = Settings(webhook_allowed_destinations="127.0.0.1")
        acts = WebhookActivities(settings, client=None, resolve=resolve)  # type: ignore[arg-type]
        url = server.url.replace("127.0.0.1", "bücher.test")
        secret = "whsec_" + base64.b64encode(b"s" * 32).decode()
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("HOOK_SECRET", secret)
            target = WebhookTarget(endpoint_id="we_1", url=url, secret_env="HOOK_SECRET")
            out = await asyncio.wait_for(
                acts.deliver_webhook(AttemptInput(event=EVENT, workspace="w", target=target)), 10
            )
        assert out.delivered, out
        assert asked == ["xn--bcher-kva.test"]
        assert receiver.headers[0]["host"].startswith("xn--bcher-kva.test")
    finally:
        await server.stop()
