"""backfill.webhooks.events: the event shape and id, signatures the openai SDK accepts, derived
secrets, the retry schedule and the destination policy."""

from __future__ import annotations

import base64
import time

import openai
import pytest

from backfill.webhooks.events import (
    EVENT_TYPES,
    Destinations,
    RetryPlan,
    WebhookEvent,
    check_url,
    derive_secret,
    event_id,
    event_type_for,
    next_attempt_at,
    refusal,
    signed_headers,
)

SECRET = "whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()


def event(type: str = "batch.completed") -> WebhookEvent:
    return WebhookEvent.for_batch("batch_abc123", type, 1_700_000_000)  # type: ignore[arg-type]


def test_event_body_is_openais_payload_and_parses_as_the_sdks_event() -> None:
    evt = event()
    headers = signed_headers([SECRET], evt, int(time.time()), evt.body())
    unwrapped = openai.OpenAI(api_key="x", webhook_secret=SECRET).webhooks.unwrap(
        evt.body(), headers
    )
    assert unwrapped.type == "batch.completed"
    assert unwrapped.id == evt.id and unwrapped.id.startswith("evt_")
    assert unwrapped.object == "event"
    assert unwrapped.created_at == 1_700_000_000
    assert unwrapped.data.id == "batch_abc123"


@pytest.mark.parametrize("type", EVENT_TYPES)
def test_every_event_type_verifies_with_the_sdk_and_a_derived_secret(type: str) -> None:
    secret = derive_secret("master", "alpha", "we_1", 0)
    evt = event(type)
    headers = signed_headers([secret], evt, int(time.time()), evt.body())
    unwrapped = openai.OpenAI(api_key="x").webhooks.unwrap(evt.body(), headers, secret=secret)
    assert unwrapped.type == type


def test_the_sdk_refuses_a_wrong_secret_or_a_changed_body() -> None:
    evt = event()
    now = int(time.time())
    hooks = openai.OpenAI(api_key="x").webhooks
    headers = signed_headers([SECRET], evt, now, evt.body())
    other = derive_secret("master", "alpha", "we_1", 1)
    with pytest.raises(openai.InvalidWebhookSignatureError):
        hooks.unwrap(evt.body(), headers, secret=other)
    with pytest.raises(openai.InvalidWebhookSignatureError):
        hooks.unwrap(evt.body().replace(b"abc", b"abd"), headers, secret=SECRET)


def test_headers_carry_the_event_id_as_webhook_id() -> None:
    evt = event()
    headers = signed_headers([SECRET], evt, 1234, evt.body())
    assert headers["webhook-id"] == evt.id
    assert headers["webhook-timestamp"] == "1234"
    assert headers["webhook-signature"].startswith("v1,")


def test_event_id_is_stable_per_batch_and_type_and_differs_otherwise() -> None:
    a = event_id("batch_1", "batch.completed")
    assert a == event_id("batch_1", "batch.completed")
    assert a != event_id("batch_2", "batch.completed")
    assert a != event_id("batch_1", "batch.failed")
    assert a.startswith("evt_") and len(a) == 4 + 32
    assert event().id == event_id("batch_abc123", "batch.completed")


def test_event_type_for_terminal_statuses_only() -> None:
    assert event_type_for("completed") == "batch.completed"
    assert event_type_for("failed") == "batch.failed"
    assert event_type_for("expired") == "batch.expired"
    assert event_type_for("cancelled") == "batch.cancelled"
    for status in ("validating", "in_progress", "finalizing", "cancelling"):
        assert event_type_for(status) is None


def test_derived_secrets_differ_by_key_workspace_endpoint_and_rotation() -> None:
    base = derive_secret("k", "ws", "we_1", 0)
    assert base.startswith("whsec_")
    assert len(base64.b64decode(base[6:])) == 32
    assert base == derive_secret("k", "ws", "we_1", 0)
    others = {
        derive_secret("k2", "ws", "we_1", 0),
        derive_secret("k", "ws2", "we_1", 0),
        derive_secret("k", "ws", "we_2", 0),
        derive_secret("k", "ws", "we_1", 1),
    }
    assert base not in others and len(others) == 4


def test_retry_schedule_doubles_to_its_cap_and_stops_after_the_window() -> None:
    plan = RetryPlan(initial_seconds=5, max_interval_seconds=60, give_up_after_seconds=300)
    assert next_attempt_at(1, 0, 0, plan) == 5
    assert next_attempt_at(2, 0, 5, plan) == 15
    assert next_attempt_at(3, 0, 15, plan) == 35
    assert next_attempt_at(5, 0, 100, plan) == 160  # 80 capped to 60
    assert next_attempt_at(9, 0, 240, plan) == 300  # the last one fits exactly
    assert next_attempt_at(10, 0, 241, plan) is None


def test_default_schedule_reaches_a_receiver_down_ten_minutes_within_about_that() -> None:
    plan = RetryPlan()
    at, n = 0.0, 1
    while at < 600:
        nxt = next_attempt_at(n, 0, at, plan)
        assert nxt is not None
        at, n = nxt, n + 1
    assert at < 1300, at  # the first attempt after the outage: at most ~11 minutes late
    # and it keeps trying for 72 hours, no longer
    while (nxt := next_attempt_at(n, 0, at, plan)) is not None:
        at, n = nxt, n + 1
    assert 71 * 3600 <= at <= 72 * 3600


@pytest.mark.parametrize(
    "url,why",
    [
        ("ftp://example.com/x", "https://"),
        ("https://user:pw@example.com/", "credentials"),
        ("https:///path", "no host"),
        ("https://example.com:99999/", "not a valid URL"),
        ("https://example.com/" + "x" * 3000, "longer"),
    ],
)
def test_check_url_refuses(url: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        check_url(url)


def test_check_url_gives_scheme_host_and_port() -> None:
    assert check_url("https://Hooks.Example.com/in") == ("https", "hooks.example.com", 443)
    assert check_url("http://example.com:8080/") == ("http", "example.com", 8080)


NONE = Destinations()


@pytest.mark.parametrize(
    "address,kind",
    [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("10.1.2.3", "private"),
        ("192.168.0.10", "private"),
        ("172.16.5.4", "private"),
        ("169.254.169.254", "link-local"),
        ("fe80::1", "link-local"),
        ("::ffff:127.0.0.1", "loopback"),
        ("0.0.0.0", ""),
        ("fc00::5", "private"),
    ],
)
def test_non_public_destinations_are_refused(address: str, kind: str) -> None:
    why = refusal("hooks.example.com", address, NONE)
    assert why is not None and kind in why and "allow-list" in why


def test_public_destinations_pass() -> None:
    assert refusal("example.com", "93.184.216.34", NONE) is None
    assert refusal("example.com", "2606:2800:220:1::1", NONE) is None


def test_the_allow_list_names_hosts_addresses_and_networks() -> None:
    allowed = Destinations.parse(["hooks.internal", " 10.0.0.5 ", "127.0.0.0/8", "", "fd00::/8"])
    assert refusal("hooks.internal", "10.9.9.9", allowed) is None  # by name
    assert refusal("other.internal", "10.0.0.5", allowed) is None  # by address
    assert refusal("localhost", "127.0.0.1", allowed) is None  # by network
    assert refusal("x", "fd00::1", allowed) is None
    assert refusal("other.internal", "10.0.0.6", allowed) is not None
    assert refusal("x", "::1", allowed) is not None  # 127.0.0.0/8 says nothing of IPv6


def test_the_allow_list_refuses_a_bad_network() -> None:
    with pytest.raises(ValueError, match="not a network"):
        Destinations.parse(["10.0.0.0/99"])


# ---- the settings and the delivery activity's refusals (no server: nothing is connected) ----
def test_configured_endpoints_are_unique_per_workspace_and_the_allow_list_parses() -> None:
    from pydantic import ValidationError

    from backfill.platform.config import Settings

    hook = {"workspace": "a", "id": "h1", "url": "https://x.example/", "secret_env": "H1"}
    s = Settings(webhooks=[hook], webhook_allowed_destinations="10.0.0.0/8, hooks.internal")
    assert s.webhooks[0].event_types == list(EVENT_TYPES)
    assert s.webhook_destinations.names("hooks.internal")
    with pytest.raises(ValidationError, match="duplicate id"):
        Settings(webhooks=[hook, hook])
    with pytest.raises(ValidationError, match="not a network"):
        Settings(webhook_allowed_destinations="10.0.0.0/40")


async def test_delivery_to_a_name_resolving_to_loopback_is_refused_for_good(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from activities.webhooks import WebhookActivities
    from backfill.platform.config import Settings
    from backfill.webhooks.events import AttemptInput, WebhookTarget

    async def resolve(host: str, port: int) -> list[str]:
        return ["93.184.216.34", "127.0.0.1"]  # one public, one loopback: refused

    monkeypatch.setenv("HOOK_SECRET", SECRET)
    acts = WebhookActivities(Settings(), client=None, resolve=resolve)  # type: ignore[arg-type]
    target = WebhookTarget(
        endpoint_id="we_1", url="https://rebind.example/", secret_env="HOOK_SECRET"
    )
    out = await acts.deliver_webhook(AttemptInput(event=event(), workspace="w", target=target))
    assert not out.delivered and out.permanent
    assert out.error is not None and "loopback" in out.error and "127.0.0.1" in out.error


async def test_delivery_without_a_secret_fails_at_once_and_says_which_variable() -> None:
    from activities.webhooks import WebhookActivities
    from backfill.platform.config import Settings
    from backfill.webhooks.events import AttemptInput, WebhookTarget

    acts = WebhookActivities(Settings(), client=None)  # type: ignore[arg-type]
    target = WebhookTarget(endpoint_id="we_1", url="https://x.example/")
    out = await acts.deliver_webhook(AttemptInput(event=event(), workspace="w", target=target))
    assert not out.delivered and out.permanent  # no later attempt would have one
    assert out.error is not None and "BACKFILL_WEBHOOK_KEY" in out.error
