"""Webhooks as OpenAI sends them: the events, their ids, their signatures, the endpoints' derived
secrets, the retry schedule and which destinations a delivery may reach (docs/decisions/0021).

Pure: no I/O, no clock (callers pass `now`), nothing from temporalio, so the workflow, the
activities and the api share it and it is unit-tested without a server. The models are the
inputs and outputs of the webhook workflows and activities (one object each).

- An event is `{"id": "evt_…", "object": "event", "type": "batch.completed", "created_at": …,
  "data": {"id": "batch_…"}}`; its id is derived from the batch id and the type, so a re-run
  never makes a new one and receivers de-duplicate on it (`webhook-id`).
- Signatures follow the Standard Webhooks specification, as the openai SDK's
  `client.webhooks.unwrap` checks them: `webhook-signature: v1,<base64 HMAC-SHA256 of
  "{id}.{timestamp}.{body}">` keyed with the base64-decoded part of the `whsec_` secret.
- An endpoint made through the api has no stored secret: it is derived from the operator's
  master key (`BACKFILL_WEBHOOK_KEY`), the workspace, the endpoint id and its rotation count, so
  workflow histories and the file store hold only the endpoint id.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, get_args
from urllib.parse import urlsplit, urlunsplit

import idna
from pydantic import BaseModel, Field

EventType = Literal["batch.completed", "batch.failed", "batch.expired", "batch.cancelled"]
EVENT_TYPES: tuple[EventType, ...] = get_args(EventType)

SECRET_PREFIX = "whsec_"
MAX_URL_LENGTH = 2048
MAX_ENDPOINTS = 10
"""Endpoints per workspace (made through the api; configured ones are not counted)."""
DELIVERIES_MEMO = "webhook_deliveries"
"""Memo key of an event workflow's `EventDeliveries` (JSON), updated after each attempt: the api
reads delivery logs from visibility, without a worker."""
LOG_ATTEMPTS = 10
"""Attempts kept per endpoint in an event's delivery log (the latest ones)."""


# ---- events ----------------------------------------------------------------------------------
def event_type_for(status: str) -> EventType | None:
    """The event a batch's terminal status announces (None for any other status)."""
    name = f"batch.{status}"
    return name if name in EVENT_TYPES else None  # type: ignore[return-value]


def event_id(batch_id: str, type: EventType) -> str:
    """`evt_` and 32 hex digits of SHA-256 over the type and the batch id: the same for every
    run, replay or retry of the batch that announces it."""
    digest = hashlib.sha256(f"{type}\n{batch_id}".encode()).hexdigest()
    return f"evt_{digest[:32]}"


def event_workflow_id(evt_id: str) -> str:
    """The delivery workflow's id: one per event, so starting it twice is harmless."""
    return f"webhook-event:{evt_id}"


def endpoints_workflow_id(workspace: str) -> str:
    """The workspace's endpoints entity workflow."""
    return f"webhook-endpoints:{workspace}"


class WebhookEvent(BaseModel):
    """One event about one batch."""

    id: str
    type: EventType
    created_at: int
    """Unix seconds of the batch's terminal status."""
    batch_id: str

    @classmethod
    def for_batch(cls, batch_id: str, type: EventType, created_at: int) -> WebhookEvent:
        return cls(id=event_id(batch_id, type), type=type, created_at=created_at, batch_id=batch_id)

    def body(self) -> bytes:
        """The request body: OpenAI's payload, compact JSON."""
        payload = {
            "id": self.id,
            "object": "event",
            "type": self.type,
            "created_at": self.created_at,
            "data": {"id": self.batch_id},
        }
        return json.dumps(payload, separators=(",", ":")).encode()


# ---- secrets and signatures ------------------------------------------------------------------
def derive_secret(master_key: str, workspace: str, endpoint_id: str, rotation: int) -> str:
    """`whsec_` + base64(HMAC-SHA256(master key, workspace, endpoint id, rotation)): recomputed
    where needed, never stored. A new rotation count gives a new secret."""
    message = f"{workspace}\n{endpoint_id}\n{rotation}".encode()
    digest = hmac.new(master_key.encode(), message, hashlib.sha256).digest()
    return SECRET_PREFIX + base64.b64encode(digest).decode()


def secret_hint(secret: str) -> str:
    """A masked form to tell secrets apart: the prefix and the last four characters."""
    return f"{SECRET_PREFIX}…{secret[-4:]}"


def _key(secret: str) -> bytes:
    if secret.startswith(SECRET_PREFIX):
        return base64.b64decode(secret[len(SECRET_PREFIX) :])
    return secret.encode()


def signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` value: `v1,` and the base64 HMAC-SHA256 of
    `{id}.{timestamp}.{body}`."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    return (
        "v1," + base64.b64encode(hmac.new(_key(secret), signed, hashlib.sha256).digest()).decode()
    )


def signed_headers(
    secrets: list[str], evt: WebhookEvent, timestamp: int, body: bytes
) -> dict[str, str]:
    """The Standard Webhooks headers of one attempt (`timestamp`: the attempt's, in seconds):
    one signature per secret, space-separated, as the specification allows (a receiver accepts
    the message when any of them verifies with its secret)."""
    return {
        "webhook-id": evt.id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(signature(s, evt.id, timestamp, body) for s in secrets),
    }


def signing_rotations(endpoint: WebhookEndpoint, now: float, grace_seconds: float) -> list[int]:
    """The rotation counts whose secrets sign a delivery to `endpoint` at `now`: the current
    one, and the previous one while its grace period after the last rotation lasts."""
    rotations = [endpoint.rotation]
    rotated_at = endpoint.rotated_at
    if endpoint.rotation > 0 and rotated_at is not None and now < rotated_at + grace_seconds:
        rotations.append(endpoint.rotation - 1)
    return rotations


# ---- endpoints -------------------------------------------------------------------------------
class WebhookEndpoint(BaseModel):
    """An endpoint, as the workspace's entity workflow (or the config file) holds it: never its
    secret."""

    id: str
    url: str
    event_types: list[EventType] = Field(default_factory=lambda: list(EVENT_TYPES))
    name: str = ""
    created_at: int = 0
    updated_at: int | None = None
    rotation: int = 0
    """How many times the secret was rotated (an input of the derived secret)."""
    rotated_at: int | None = None
    """When the secret was last rotated (unix seconds): the previous one stays valid for the
    grace period after it (`signing_rotations`)."""
    secret_env: str | None = None
    """Configured endpoints: the environment variable holding the secret (api ones: None, the
    secret is derived)."""
    source: Literal["api", "config"] = "api"


class EndpointsInput(BaseModel):
    """WebhookEndpointsWorkflow's input and state (workflow id: `endpoints_workflow_id`)."""

    workspace: str
    endpoints: list[WebhookEndpoint] = Field(default_factory=list)


class EndpointId(BaseModel):
    """Names one endpoint of the workspace (remove, rotate)."""

    id: str


class RetryPlan(BaseModel):
    """When a failed delivery is tried again: `initial_seconds` after the first attempt,
    doubling up to `max_interval_seconds`, no attempt later than `give_up_after_seconds` after
    the first."""

    initial_seconds: float = Field(default=5.0, gt=0)
    max_interval_seconds: float = Field(default=3600.0, gt=0)
    give_up_after_seconds: float = Field(default=72 * 3600.0, ge=0)


def next_attempt_at(attempts: int, first_at: float, now: float, plan: RetryPlan) -> float | None:
    """When to try again after `attempts` failed ones (the first at `first_at`), or None when
    the next would fall past the plan's end."""
    delay = min(plan.initial_seconds * 2 ** max(attempts - 1, 0), plan.max_interval_seconds)
    at = now + delay
    return at if at <= first_at + plan.give_up_after_seconds else None


class WebhookTarget(BaseModel):
    """An endpoint an event goes to, as the event found it."""

    endpoint_id: str
    url: str
    rotation: int = 0
    secret_env: str | None = None


class DeliveryPlan(BaseModel):
    """Where an event goes and how hard to try (read from the config and the endpoints when the
    event is raised)."""

    targets: list[WebhookTarget] = Field(default_factory=list)
    retry: RetryPlan = Field(default_factory=RetryPlan)
    attempt_timeout_seconds: float = 10.0


class AnnounceInput(BaseModel):
    """A batch's terminal event, to be delivered to its workspace's subscribed endpoints."""

    event: WebhookEvent
    workspace: str


class AnnounceOutput(BaseModel):
    targets: int
    """Endpoints the event goes to (0: no delivery workflow was started)."""


class EventInput(BaseModel):
    """WebhookEventWorkflow's input (workflow id: `event_workflow_id`)."""

    event: WebhookEvent
    workspace: str
    plan: DeliveryPlan


class AttemptInput(BaseModel):
    event: WebhookEvent
    workspace: str
    target: WebhookTarget
    timeout_seconds: float = 10.0


class AttemptOutcome(BaseModel):
    delivered: bool
    status_code: int | None = None
    """The receiver's HTTP status (None: no answer)."""
    error: str | None = None
    permanent: bool = False
    """Not worth trying again (the destination is refused)."""


class AttemptRecord(BaseModel):
    """One attempt in the delivery log."""

    at: int
    status_code: int | None = None
    error: str | None = None
    next_retry_at: int | None = None


DeliveryState = Literal["pending", "delivered", "failed"]


class TargetLog(BaseModel):
    """An event's deliveries to one endpoint: state, count and the latest attempts."""

    endpoint_id: str
    url: str
    state: DeliveryState = "pending"
    attempts: int = 0
    last_attempts: list[AttemptRecord] = Field(default_factory=list)

    def record(self, attempt: AttemptRecord, state: DeliveryState) -> None:
        self.attempts += 1
        self.state = state
        self.last_attempts = [*self.last_attempts, attempt][-LOG_ATTEMPTS:]


class EventDeliveries(BaseModel):
    """An event and its deliveries: the delivery workflow's result, query and memo."""

    event: WebhookEvent
    workspace: str
    targets: list[TargetLog] = Field(default_factory=list)


# ---- destinations ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Destinations:
    """The operator's allow-list: host names, addresses and networks a delivery may reach
    although they are private, loopback or link-local."""

    hosts: frozenset[str] = frozenset()
    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()

    @classmethod
    def parse(cls, entries: Iterable[str]) -> Destinations:
        """From entries such as `hooks.internal`, `10.0.0.5`, `127.0.0.0/8`, `::1`; a bad network
        raises ValueError naming it."""
        hosts, networks = set(), []
        for raw in entries:
            entry = raw.strip().lower()
            if not entry:
                continue
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                if "/" in entry:
                    raise ValueError(f"not a network: {raw!r}") from None
                hosts.add(entry.rstrip("."))
        return cls(frozenset(hosts), tuple(networks))

    def names(self, host: str) -> bool:
        return host.lower().rstrip(".") in self.hosts

    def contain(self, address: str) -> bool:
        ip = ipaddress.ip_address(address)
        return any(ip.version == n.version and ip in n for n in self.networks)


def check_url(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of a webhook URL; ValueError saying what is wrong with it."""
    if len(url) > MAX_URL_LENGTH:
        raise ValueError(f"the URL is longer than {MAX_URL_LENGTH} characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise ValueError(f"not a valid URL: {e}") from None
    if parts.scheme not in ("https", "http"):
        raise ValueError("the URL must start with https:// (or http://)")
    if parts.username is not None or parts.password is not None:
        raise ValueError("the URL must not carry credentials")
    host = (parts.hostname or "").lower()
    if not host:
        raise ValueError("the URL has no host")
    return parts.scheme, ascii_host(host), port or (443 if parts.scheme == "https" else 80)


def ascii_host(host: str) -> str:
    """`host` as it goes on the wire and to the resolver: an internationalized name encoded
    with IDNA 2008 (`bücher.example` -> `xn--bcher-kva.example`); ValueError when it cannot be."""
    if host.isascii():
        return host
    try:
        return idna.encode(host.rstrip("."), uts46=True).decode("ascii")
    except idna.IDNAError as e:
        raise ValueError(f"the host {host!r} is not a valid internationalized name: {e}") from None


def delivery_url(url: str) -> str:
    """`url` with its host IDNA-encoded (`ascii_host`), as the connection needs it."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if host.isascii():
        return url
    netloc = ascii_host(host) + (f":{parts.port}" if parts.port is not None else "")
    return urlunsplit(parts._replace(netloc=netloc))


_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")


def embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries to its destination: IPv4-mapped (`::ffff:a.b.c.d`),
    NAT64 (`64:ff9b::a.b.c.d`, RFC 6052), IPv4-compatible (`::a.b.c.d`, deprecated but still
    routed by some stacks) and 6to4 (`2002:AABB:CCDD::`); None for any other."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in _NAT64 or (ip in _IPV4_COMPATIBLE and int(ip) > 1):  # not :: or ::1
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip.sixtofour


def refusal(host: str, address: str, allowed: Destinations) -> str | None:
    """Why a delivery to `host` must not connect to `address`, or None when it may: private,
    loopback, link-local, multicast, reserved and unspecified addresses are refused unless the
    allow-list names the host or contains the address. An IPv6 address that carries an IPv4 one
    (`embedded_ipv4`: mapped, NAT64, IPv4-compatible, 6to4) is judged by that IPv4 address."""
    given = ipaddress.ip_address(address)
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address = given
    if isinstance(given, ipaddress.IPv6Address):
        ip = embedded_ipv4(given) or given  # judged by the IPv4 address it reaches
    if ip.is_global and not ip.is_multicast:
        return None
    if allowed.names(host) or allowed.contain(str(ip)) or allowed.contain(str(given)):
        return None
    kind = (
        "loopback"
        if ip.is_loopback
        else "link-local"
        if ip.is_link_local
        else "private"
        if ip.is_private
        else "non-public"
    )
    return f"{host} resolves to a {kind} address ({ip}), which is not on the allow-list"
