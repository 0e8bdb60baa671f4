"""The file's sections: models and their routes, limits, API keys, workspaces and webhooks
(`backfill.toml`; every model forbids unknown fields and is frozen)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from backfill.routes.gates.cap import DEFAULT_LINES_AT_ONCE, LinesAtOnce
from backfill.routes.settings import ConfiguredSettings, RouteSettings, declared_settings
from backfill.webhooks.events import EVENT_TYPES as WEBHOOK_EVENTS
from backfill.webhooks.events import EventType as WebhookEventType

Role = Literal["member", "platform_admin", "auditor"]
Provider = Literal["vllm", "openai"]
BodyField = Literal["background", "store", "previous_response_id", "conversation", "service_tier"]
"""Body fields held back unless a route allows them (`backfill.upstream.body_policy`)."""
WorkerRole = Literal["all", "workflows", "activities"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


MIN_WEBHOOK_KEY_LENGTH = 32
"""Shortest `BACKFILL_WEBHOOK_KEY` accepted at start (`openssl rand -hex 32` makes 64)."""


class RouteConfig(_Strict):
    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
    """Route id: also the scheduler's identity and the management API's deployment id."""
    provider: Provider = "vllm"
    """`vllm` (or any OpenAI-compatible self-hosted server) or `openai` (a cloud route)."""
    base_url: str = Field(pattern=r"^https?://")
    """Upstream base URL including `/v1`, e.g. `http://127.0.0.1:8100/v1`."""
    api_key_env: str | None = None
    """Name of the environment variable that holds the upstream API key (the key never lives in
    the file, in workflow histories or in logs)."""
    weight: int = Field(default=1, ge=1, le=1000)
    """Share of the model's lines routed here (weighted, deterministic per line)."""
    max_concurrent_lines: LinesAtOnce = DEFAULT_LINES_AT_ONCE
    """Initial "Batch lines at once" for the route's scheduler; after first start the durable
    value lives in the scheduler workflow and is changed through its update."""
    allow_body_fields: list[BodyField] = Field(default_factory=list)
    """Body fields otherwise refused or held back on this route (`backfill.upstream.body_policy`,
    decision 0028): the Responses API's `background`, `store`, `previous_response_id` and
    `conversation`, and `service_tier` on `openai` routes. For a single-tenant route only."""
    settings: RouteSettings | None = None
    """The route's batch-scheduling settings as code (`[models.routes.settings]`): any fields of
    the management API's settings document, validated as a `PUT` would be. Applied when the
    route's scheduler starts and whenever a worker starts with a table that differs from the one
    last applied; between two changes a `PUT` wins (docs/decisions/0039)."""

    @model_validator(mode="after")
    def _cap_once(self) -> RouteConfig:
        if (
            self.settings is not None
            and "max_concurrent_lines" in self.settings.model_fields_set
            and "max_concurrent_lines" in self.model_fields_set
        ):
            raise ValueError(
                "max_concurrent_lines is set both on the route and in its settings table; keep "
                "the one in settings (applied again when it changes)"
            )
        return self

    def configured(self) -> ConfiguredSettings:
        """What the file says of the route's settings (the scheduler's `configure` signal)."""
        cap = self.max_concurrent_lines if "max_concurrent_lines" in self.model_fields_set else None
        return ConfiguredSettings(declared=declared_settings(self.settings), cap=cap)


class ModelConfig(_Strict):
    id: str = Field(min_length=1, max_length=256)
    """The model name clients put in `body.model`."""
    routes: list[RouteConfig] = Field(min_length=1)


class Limits(_Strict):
    max_file_bytes: int = Field(default=200 * 1024 * 1024, ge=1)
    """Largest accepted upload (enforced while streaming)."""
    max_request_bytes: int = Field(default=1024 * 1024, ge=1024)
    """Largest body of any other request to the api (creating a batch, route settings),
    refused with 413 before it is parsed or the key is checked. Live requests may be as large
    as a batch line (`max_line_bytes`) when that is larger."""
    input_file_expiry_seconds: int = Field(default=30 * 86400, ge=3600)
    """How long an uploaded batch input is kept when the upload names no `expires_after`
    (OpenAI's default: 30 days). Batch outputs are kept until deleted unless the batch was
    created with `output_expires_after`."""
    max_lines_per_batch: int = Field(default=50_000, ge=1)
    order_lines_by_prefix: bool = True
    """Start a batch's lines that share a prompt prefix together, so the model server's prefix
    cache serves them (`backfill.batches.prefix_order`); off: lines start in input order. Read when
    a batch is validated; the output is in input order either way."""
    max_line_bytes: int = Field(default=1024 * 1024, ge=16)
    """Largest accepted input line, in bytes, without its newline."""
    max_response_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    """Largest upstream response body kept; bigger ones fail the line with `response_too_large`."""
    line_timeout_seconds: float = Field(default=600.0, gt=0)
    """How long one upstream request may take."""
    live_buffer_bytes: int = Field(default=1024 * 1024, ge=64 * 1024)
    """Of one live answer, the most the api reads ahead of its client (`api.live.relay`): an
    answer that fits stops counting on the route when the model server has sent it, however
    slowly the client reads."""
    live_buffer_total_bytes: int = Field(default=64 * 1024 * 1024, ge=64 * 1024)
    """... and of all the live answers of one api process together."""
    live_stall_seconds: float = Field(default=30.0, gt=0, le=3600)
    """A live client that takes nothing of its answer for this long is disconnected and its
    upstream request closed."""
    max_line_retries: int = Field(default=5, ge=0)
    """How many times a line that met 429/503/connection refused goes back to the queue."""
    line_heartbeat_timeout_seconds: float = Field(default=7.0, ge=4.0, le=600.0)
    """A line whose worker sent no heartbeat this long is lost and runs again on another
    worker: about the longest a SIGKILLed worker's lines wait (docs/performance.md, crash
    detection). A running line heartbeats every half of it (none if answered sooner), so
    lower means faster recovery for more heartbeat calls on Temporal, and less room for a
    worker's stalled event loop before its lines are wrongly declared lost. At least 4 s: a
    worker sends heartbeats at most every 2 s (`MAX_HEARTBEAT_THROTTLE_SECONDS`)."""


class ApiKeyConfig(_Strict):
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    """Hex SHA-256 of the key; the key itself is never stored."""
    workspace: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
    role: Role = "member"
    name: str = ""
    """Human label (shown as `paused_by`, in logs); never the key."""
    id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
    """Key id (`backfill keys create` makes one): recorded in each batch's identity snapshot
    and in audit events. Without one, `key_` and the hash's first 12 hex digits stand in."""
    models: list[str] | None = None
    """The models this key may use, in batches and live requests (absent: every model)."""

    @property
    def key_id(self) -> str:
        return self.id or f"key_{self.sha256[:12]}"


class WorkspaceLimits(_Strict):
    """Limits of one workspace (`[workspaces.<name>]`; `[workspaces.default]` applies to every
    workspace without its own table). Exceeding one answers 429; nothing accepted changes."""

    max_active_batches: int | None = Field(default=100, ge=1)
    """Batches queued or running at once, counted exactly (one admission workflow per
    workspace; None: no limit)."""
    max_queued_lines: int | None = Field(default=1_000_000, ge=1)
    """Input lines of the workspace's batches queued or running, together (None: no limit)."""
    max_stored_bytes: int | None = Field(default=50 * 1024**3, ge=1)
    """Bytes of files the workspace may keep stored: uploads, batch outputs, and the pinned
    inputs of its running batches whose upload was deleted (None: no limit). Only uploads are
    refused; a batch's output is always written."""
    max_files: int | None = Field(default=10_000, ge=1)
    """Files the workspace may keep stored at once: uploads (a job's request is one) and
    batch outputs (None: no limit). Only uploads are refused; a batch's output is always
    written. It bounds what listing the workspace's files reads."""
    max_live_in_flight: int | None = Field(default=256, ge=1)
    """Live requests (the proxy's chat, completions, embeddings...) in flight at once, per api
    process; one more answers 429 at once (None: no limit)."""
    max_live_counted: int | None = Field(default=32, ge=1)
    """Of the workspace's live requests in flight on one route in one api process, the most
    that count toward the route's live count (yield to live traffic, seat-aware admission,
    preemption); the others are served all the same (None: all count)."""
    share_weight: int = Field(default=1, ge=1, le=1000)
    """Weight of the workspace in the scheduler's fair share of a route (default equal)."""


class WebhookConfig(_Strict):
    """An endpoint in the file (`[[webhooks]]`), besides those made through the api. Its
    secret is in the environment variable `secret_env` (a `whsec_` value), never in the file."""

    workspace: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
    url: str = Field(pattern=r"^https?://")
    secret_env: str = Field(min_length=1)
    event_types: list[WebhookEventType] = Field(default_factory=lambda: list(WEBHOOK_EVENTS))
    """Which of `batch.completed`, `batch.failed`, `batch.expired`, `batch.cancelled` it gets
    (absent: all four)."""
    name: str = ""
