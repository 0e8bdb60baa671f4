"""`Settings`: everything a process needs, from the environment (the process settings, which win)
and the TOML file (the sections)."""

from __future__ import annotations

import hmac
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from backfill.platform.config.dev import DEV_KEYS, LOOPBACK_HOST_HEADERS, LOOPBACK_HOSTS, hash_key
from backfill.platform.config.sections import (
    MIN_WEBHOOK_KEY_LENGTH,
    ApiKeyConfig,
    Limits,
    ModelConfig,
    RouteConfig,
    WebhookConfig,
    WorkerRole,
    WorkspaceLimits,
)
from backfill.preemption.peers import DEFAULT_PREEMPT_NETWORKS, parse_networks
from backfill.preemption.signing import MIN_TOKEN_LENGTH
from backfill.routes.settings import settings_problem
from backfill.upstream.load_metrics import approved_bases
from backfill.webhooks.events import Destinations, WebhookEndpoint


class Settings(BaseSettings):
    """Everything a process needs. Built once by `get_settings()`; tests build their own."""

    # Only the upper-case names documented per field are read from the environment (e.g.
    # TEMPORAL_ADDRESS, BACKFILL_DATA_DIR): a stray MODELS or DATA_DIR variable changes nothing.
    model_config = SettingsConfigDict(
        extra="forbid",
        frozen=True,
        populate_by_name=True,
        env_prefix="BACKFILL_",
        case_sensitive=True,
    )

    data_dir: Path = Field(default=Path("data"), validation_alias="BACKFILL_DATA_DIR")
    """Root of the local file store (uploads, per-line results, outputs) and of the usage
    journal (which stays local with either store)."""
    store: Literal["local", "s3"] = Field(default="local", validation_alias="BACKFILL_STORE")
    """Where files live: `local` (the directory `data_dir`) or `s3` (an S3-compatible bucket;
    docs/storage.md). S3 credentials come from the standard AWS chain (environment, shared
    config files, instance or pod roles), never from this file."""
    s3_bucket: str | None = Field(default=None, validation_alias="BACKFILL_S3_BUCKET")
    """The bucket (must exist) when `store` is `s3`."""
    s3_prefix: str = Field(default="", validation_alias="BACKFILL_S3_PREFIX")
    """Key prefix of every object (e.g. `backfill/`), so one bucket can hold several stores."""
    s3_endpoint_url: str | None = Field(default=None, validation_alias="BACKFILL_S3_ENDPOINT_URL")
    """The S3 API's URL for MinIO, Ceph and the like (unset: AWS)."""
    s3_region: str | None = Field(default=None, validation_alias="BACKFILL_S3_REGION")
    """The bucket's region (unset: the AWS chain's, e.g. AWS_REGION)."""
    s3_part_bytes: int = Field(
        default=8 * 1024 * 1024, ge=5 * 1024 * 1024, validation_alias="BACKFILL_S3_PART_BYTES"
    )
    """Part size of multipart uploads, and the most an upload buffers in memory (S3's minimum
    part is 5 MiB)."""
    temporal_address: str = Field(
        default="127.0.0.1:7233",
        validation_alias="TEMPORAL_ADDRESS",
    )
    temporal_namespace: str = Field(
        default="default",
        validation_alias="TEMPORAL_NAMESPACE",
    )
    temporal_api_key: str | None = Field(
        default=None,
        repr=False,
        validation_alias="TEMPORAL_API_KEY",
    )
    """API key for Temporal Cloud or a secured cluster (env only in practice; never logged)."""
    temporal_tls: bool = Field(default=False, validation_alias="TEMPORAL_TLS")
    temporal_tls_cert: Path | None = Field(default=None, validation_alias="TEMPORAL_TLS_CERT")
    temporal_tls_key: Path | None = Field(default=None, validation_alias="TEMPORAL_TLS_KEY")
    task_queue: str = Field(default="backfill", validation_alias="BACKFILL_TASK_QUEUE")
    api_host: str = Field(default="127.0.0.1", validation_alias="BACKFILL_API_HOST")
    dev_stack: bool = Field(default=False, validation_alias="BACKFILL_DEV_STACK")
    """This is a development stack (`backfill dev` and the test stacks set it): only then may
    the api serve the public dev keys of the repository's backfill.toml (`check_exposure`)."""
    api_port: int = Field(default=8000, validation_alias="BACKFILL_API_PORT")
    api_metrics_port: int | None = Field(
        default=None, ge=0, le=65535, validation_alias="BACKFILL_API_METRICS_PORT"
    )
    """If set, the api also serves `/metrics` without a key on `api_metrics_host` and this port
    (for a Prometheus on a private network). `/metrics` on the api port always needs a
    platform_admin or auditor key: it shows every workspace's names, models and tokens."""
    api_metrics_host: str = Field(default="127.0.0.1", validation_alias="BACKFILL_API_METRICS_HOST")
    """Address of the api's key-less `/metrics` port (`api_metrics_port`)."""
    forwarded_allow_ips: str = Field(
        default="127.0.0.1", validation_alias="BACKFILL_FORWARDED_ALLOW_IPS"
    )
    """Comma-separated addresses (or `*`) of the reverse proxies whose `X-Forwarded-For` and
    `X-Forwarded-Proto` the api believes (uvicorn's `forwarded_allow_ips`). Behind a TLS proxy
    on another host, name it here: the console's cookies get `Secure` and answers get HSTS
    only when the request is known to have come over https."""
    api_max_concurrency: int = Field(
        default=1024, ge=1, validation_alias="BACKFILL_API_MAX_CONCURRENCY"
    )
    """Connections (or requests) the api serves at once; past it uvicorn answers 503 at once, so
    slow or idle clients cannot hold every socket and file descriptor (uvicorn's
    `limit_concurrency`). Keep it above the live requests you expect at once."""
    api_buffer_bytes: int = Field(
        default=192 * 1024 * 1024, ge=16 * 1024 * 1024, validation_alias="BACKFILL_API_BUFFER_BYTES"
    )
    """What one api process holds at once, together, of request bodies (3 times each body's
    size: its bytes, their decoding and the body sent on; an upload, its part buffer and chunk
    while it streams), of the answers it builds whole (a results page, a job's output) and of
    file downloads (2 MiB each in flight), in `backfill.tenancy.byte_budget`. A request that does
    not fit is answered 503 `gateway_busy` with `Retry-After` (a body before it is read)."""
    api_buffer_workspace_bytes: int = Field(
        default=48 * 1024 * 1024,
        ge=4 * 1024 * 1024,
        validation_alias="BACKFILL_API_BUFFER_WORKSPACE_BYTES",
    )
    """Of `api_buffer_bytes`, what one workspace's requests may hold (those of its keys;
    requests without a key share one part)."""
    api_usage_buffer_bytes: int = Field(
        default=64 * 1024 * 1024, ge=0, validation_alias="BACKFILL_API_USAGE_BUFFER_BYTES"
    )
    """Unstreamed live answers one api process keeps at once to read their token usage (each at
    most 16 MiB). An answer that does not fit is relayed all the same, and its journal entry
    counts the request with 0 tokens."""
    api_usage_buffer_workspace_bytes: int = Field(
        default=16 * 1024 * 1024, ge=0, validation_alias="BACKFILL_API_USAGE_BUFFER_WORKSPACE_BYTES"
    )
    """Of `api_usage_buffer_bytes`, what one workspace's answers may hold."""
    api_keepalive_seconds: int = Field(
        default=5, ge=1, le=600, validation_alias="BACKFILL_API_KEEPALIVE_SECONDS"
    )
    """How long an idle keep-alive connection to the api stays open (uvicorn's
    `timeout_keep_alive`). A load balancer in front should close idle connections sooner."""
    api_allowed_hosts: str = Field(default="", validation_alias="BACKFILL_API_ALLOWED_HOSTS")
    """Comma-separated `Host` names the api answers (`*.example.com` patterns, `*`: any); other
    requests get 400. Empty: the loopback names when `api_host` is a loopback address (so a web
    page cannot reach a dev api through DNS rebinding), else any."""
    worker_metrics_host: str = Field(
        default="127.0.0.1", validation_alias="BACKFILL_WORKER_METRICS_HOST"
    )
    """Address the worker's `/metrics` listens on (`0.0.0.0` to be scraped from elsewhere)."""
    worker_metrics_port: int = Field(
        default=9464, ge=0, le=65535, validation_alias="BACKFILL_WORKER_METRICS_PORT"
    )
    """Port of the worker's `/metrics` (gateway metrics and the Temporal SDK's); 0: any free
    port (logged at start)."""
    preempt_token: str | None = Field(
        default=None, repr=False, validation_alias="BACKFILL_PREEMPT_TOKEN"
    )
    """Shared secret of the api processes and workers for preemptive yield's direct channel
    (docs/decisions/0023): the key every report is signed with (HMAC-SHA256; the token itself
    is never sent, docs/decisions/0046). At least 32 characters (`openssl rand -hex 32`). Unset:
    the channel is off and no line is ever preempted. Never logged."""
    preempt_networks: str = Field(
        default=DEFAULT_PREEMPT_NETWORKS, validation_alias="BACKFILL_PREEMPT_NETWORKS"
    )
    """Comma-separated networks (CIDR) a worker's channel address found on the task queue must
    be in to be sent reports; any other address a poller identity names is ignored (and
    counted). Default: loopback and the private ranges (RFC 1918, IPv6 unique local)."""
    preempt_max_peers: int = Field(
        default=64, ge=1, le=4096, validation_alias="BACKFILL_PREEMPT_MAX_PEERS"
    )
    """Other workers whose lines a worker keeps per route; a report from one more is dropped
    (and counted)."""
    preempt_max_peer_lines: int = Field(
        default=8192, ge=1, le=1_000_000, validation_alias="BACKFILL_PREEMPT_MAX_PEER_LINES"
    )
    """Other workers' lines a worker keeps per route, all of them together; a report that would
    take it beyond is dropped (and counted). Each preemption ranks these lines."""
    preempt_worker_urls: str = Field(default="", validation_alias="BACKFILL_PREEMPT_WORKER_URLS")
    """api processes: comma-separated base URLs of the workers' HTTP servers (their `/metrics`
    address, e.g. `http://10.0.0.5:9464`), sent each route's live count when its preemptive yield
    is on."""
    metrics_poll_seconds: float = Field(
        default=10.0, gt=0, validation_alias="BACKFILL_METRICS_POLL_SECONDS"
    )
    """How often each worker's exporter reads the route schedulers and in-progress batches for
    the route and stall metrics (docs/metrics.md)."""
    worker_role: WorkerRole = Field(default="all", validation_alias="BACKFILL_WORKER_ROLE")
    """What this worker process runs: `all` (workflows and activities, the default), `workflows`
    (the batch and scheduler workflows only) or `activities` (lines, validation, finalizing and the
    rest). Splitting keeps workflow tasks clear of a heavy line load and lets line workers scale
    apart; it gives up eager lines (docs/operator-guide.md, docs/decisions/0016-worker-roles.md).
    A task queue needs workers of both kinds."""
    worker_eager_activities: int = Field(
        default=256, ge=0, le=1024, validation_alias="BACKFILL_WORKER_EAGER_ACTIVITIES"
    )
    """Lines (and other activities) a worker may take straight from the workflow task that
    schedules them, at most this many per workflow task (Temporal's eager activity execution),
    instead of through the task queue; 0: none. Eager lines start at once and cost the Temporal
    server about half the work; they run on the worker that runs their batch's workflow, up to
    its free slots (the rest go through the queue to any worker). See docs/performance.md."""
    worker_max_concurrent_activities: int = Field(
        default=512,
        ge=1,
        validation_alias="BACKFILL_WORKER_MAX_CONCURRENT_ACTIVITIES",
    )
    """Activity slots per worker: must cover the sum of route caps this worker serves."""
    worker_buffer_bytes: int = Field(
        default=1024 * 1024 * 1024,
        ge=16 * 1024 * 1024,
        validation_alias="BACKFILL_WORKER_BUFFER_BYTES",
    )
    """What the running lines of one worker process hold at once, together: each its request
    (3 times its line's size, with the partial answer it continues: the line, its decoding and
    the body sent) and its answer (twice:
    the answer and its record) (`backfill.tenancy.byte_budget`). A line whose request does not fit
    waits for room (`activities.lines.run_line.BUFFER_WAIT_SECONDS`), then goes back to its queue
    unsent, nothing counted; one whose answer outgrows the room left is sent again later
    (`worker_busy`, counted as a retry)."""
    worker_buffer_workspace_bytes: int = Field(
        default=256 * 1024 * 1024,
        ge=16 * 1024 * 1024,
        validation_alias="BACKFILL_WORKER_BUFFER_WORKSPACE_BYTES",
    )
    """Of `worker_buffer_bytes`, what the lines of one workspace's batches may hold."""
    upstream_keepalive_seconds: float = Field(
        default=2.0,
        gt=0,
        validation_alias="BACKFILL_UPSTREAM_KEEPALIVE_SECONDS",
    )
    """How long the worker keeps an idle connection to a model server for reuse. Keep it below
    the servers' own idle timeout (vLLM and uvicorn close idle connections after 5 s), so the
    worker does not send a line on a connection the server is closing."""
    worker_sticky_queue_timeout_seconds: float = Field(
        default=2.0,
        gt=0,
        validation_alias="BACKFILL_WORKER_STICKY_QUEUE_TIMEOUT_SECONDS",
    )
    """How long a workflow task waits on a worker's own (sticky) queue before any worker may
    take it (with a full history replay). A SIGKILLed worker's queue is skipped at once (its
    polls are gone); this bounds a worker that is alive but stalled."""
    worker_loop_lag_log_seconds: float | None = Field(
        default=None,
        gt=0,
        validation_alias="BACKFILL_WORKER_LOOP_LAG_LOG_SECONDS",
    )
    """If set, the worker logs its event loop's lag (p50/p99/max) this often (INFO level)."""
    worker_shutdown_grace_seconds: float | None = Field(
        default=None,
        ge=0,
        validation_alias="BACKFILL_WORKER_SHUTDOWN_GRACE_SECONDS",
    )
    """How long a worker told to stop (SIGTERM, SIGINT) lets its running lines finish before it
    cancels them and exits; unset: `limits.line_timeout_seconds`, so every line can finish. A
    second signal exits at once."""
    scheduler_reconcile_seconds: float = Field(
        default=30.0,
        gt=0,
        validation_alias="BACKFILL_SCHEDULER_RECONCILE_SECONDS",
    )
    """How often a route's scheduler checks that the batches holding its slots still run."""
    gateway_local_upstreams: str = Field(default="", validation_alias="GATEWAY_LOCAL_UPSTREAMS")
    """Comma-separated upstream base URLs (ending in `/v1`) whose `/metrics` a route's server
    load signal may read, besides the routes' own base URLs."""
    cleanup_interval_seconds: int = Field(
        default=3600, ge=0, validation_alias="BACKFILL_CLEANUP_INTERVAL_SECONDS"
    )
    """How often the retention Schedule deletes expired files (0: workers do not create it)."""
    usage_retention_days: int = Field(
        default=400, ge=31, validation_alias="BACKFILL_USAGE_RETENTION_DAYS"
    )
    """Usage journal hours older than this are deleted (by every process that journals, at
    start and hourly); at least 31, the console's longest usage view."""
    webhook_key: str | None = Field(
        default=None, repr=False, validation_alias="BACKFILL_WEBHOOK_KEY"
    )
    """Master key the signing secret of every endpoint made through the api is derived from
    (docs/decisions/0021); without it such endpoints cannot be made or delivered to. Env only;
    changing it changes every derived secret. At least `MIN_WEBHOOK_KEY_LENGTH` characters: a
    receiver holds message/signature pairs, so a weak key could be found offline, and with it
    every workspace's secret."""
    webhook_rotation_grace_seconds: float = Field(
        default=24 * 3600.0, ge=0, validation_alias="BACKFILL_WEBHOOK_ROTATION_GRACE_SECONDS"
    )
    """After a rotation, how long the previous secret stays valid: deliveries in this time carry
    both signatures (Standard Webhooks allows several), so a receiver may switch at any moment."""
    webhook_allowed_destinations: str = Field(
        default="", validation_alias="BACKFILL_WEBHOOK_ALLOWED_DESTINATIONS"
    )
    """Comma-separated host names, addresses and networks (`hooks.internal`, `10.0.0.5`,
    `127.0.0.0/8`) webhooks may reach although private, loopback or link-local."""
    webhook_timeout_seconds: float = Field(
        default=10.0, gt=0, le=60, validation_alias="BACKFILL_WEBHOOK_TIMEOUT_SECONDS"
    )
    """How long one delivery attempt may take, name resolution included."""
    webhook_retry_initial_seconds: float = Field(
        default=5.0, gt=0, validation_alias="BACKFILL_WEBHOOK_RETRY_INITIAL_SECONDS"
    )
    """Wait before the second attempt; each next wait doubles."""
    webhook_retry_max_interval_seconds: float = Field(
        default=3600.0, gt=0, validation_alias="BACKFILL_WEBHOOK_RETRY_MAX_INTERVAL_SECONDS"
    )
    """The longest wait between two attempts."""
    webhook_retry_for_seconds: float = Field(
        default=72 * 3600.0, ge=0, validation_alias="BACKFILL_WEBHOOK_RETRY_FOR_SECONDS"
    )
    """No attempt later than this after the first (72 h, as OpenAI)."""
    limits: Limits = Field(default_factory=Limits)
    models: list[ModelConfig] = Field(default_factory=list)
    api_keys: list[ApiKeyConfig] = Field(default_factory=list)
    workspaces: dict[str, WorkspaceLimits] = Field(default_factory=dict)
    """Per-workspace limits by workspace name; the entry `default` applies to the others."""
    webhooks: list[WebhookConfig] = Field(default_factory=list)
    """Configured webhook endpoints (`[[webhooks]]`)."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The environment wins over the file (which arrives as init kwargs); models, limits
        # and API keys come from the file only.
        return (
            _ScalarEnv(settings_cls, env_prefix="BACKFILL_", case_sensitive=True),
            init_settings,
        )

    @model_validator(mode="after")
    def _unique_ids(self) -> Settings:
        seen_models: set[str] = set()
        seen_routes: set[str] = set()
        for m in self.models:
            if m.id in seen_models:
                raise ValueError(f"models: duplicate model id {m.id!r}")
            seen_models.add(m.id)
            for r in m.routes:
                if r.id in seen_routes:
                    raise ValueError(f"models.routes: duplicate route id {r.id!r}")
                seen_routes.add(r.id)
        seen_keys: set[str] = set()
        for k in self.api_keys:
            if k.key_id in seen_keys:
                raise ValueError(f"api_keys: duplicate key id {k.key_id!r}")
            seen_keys.add(k.key_id)
        return self

    @model_validator(mode="after")
    def _s3_bucket_named(self) -> Settings:
        if self.store == "s3" and not self.s3_bucket:
            raise ValueError("BACKFILL_STORE is s3 but BACKFILL_S3_BUCKET is not set")
        return self

    @model_validator(mode="after")
    def _preempt_channel_valid(self) -> Settings:
        if self.preempt_token and len(self.preempt_token) < MIN_TOKEN_LENGTH:
            raise ValueError(
                f"BACKFILL_PREEMPT_TOKEN has {len(self.preempt_token)} characters; it must have "
                f"at least {MIN_TOKEN_LENGTH} (make one with `openssl rand -hex 32`)"
            )
        parse_networks(self.preempt_networks)
        return self

    @model_validator(mode="after")
    def _webhooks_valid(self) -> Settings:
        if self.webhook_key and len(self.webhook_key) < MIN_WEBHOOK_KEY_LENGTH:
            raise ValueError(
                f"BACKFILL_WEBHOOK_KEY has {len(self.webhook_key)} characters; it must have at "
                f"least {MIN_WEBHOOK_KEY_LENGTH} (make one with `openssl rand -hex 32`)"
            )
        Destinations.parse(self.webhook_allowed_destinations.split(","))
        seen: set[tuple[str, str]] = set()
        for w in self.webhooks:
            if (w.workspace, w.id) in seen:
                raise ValueError(f"webhooks: duplicate id {w.id!r} in workspace {w.workspace!r}")
            seen.add((w.workspace, w.id))
        return self

    @model_validator(mode="after")
    def _route_settings_valid(self) -> Settings:
        bases = configured_bases(self)
        for i, m in enumerate(self.models):
            for j, r in enumerate(m.routes):
                problem = r.settings and settings_problem(r.settings, r.id, r.provider, bases)
                if problem:
                    raise ValueError(
                        f"models.{i}.routes.{j}.settings.{problem[0]} (route {r.id!r} of model "
                        f"{m.id!r}): {problem[1]}"
                    )
        return self

    @property
    def webhook_destinations(self) -> Destinations:
        """`webhook_allowed_destinations`, parsed."""
        return Destinations.parse(self.webhook_allowed_destinations.split(","))

    @property
    def shutdown_grace_seconds(self) -> float:
        """`worker_shutdown_grace_seconds`, or the line timeout when unset."""
        if self.worker_shutdown_grace_seconds is not None:
            return self.worker_shutdown_grace_seconds
        return self.limits.line_timeout_seconds

    def allowed_hosts(self) -> list[str]:
        """`api_allowed_hosts` as a list, or its default (see there)."""
        named = [h.strip() for h in self.api_allowed_hosts.split(",") if h.strip()]
        if named:
            return named
        return list(LOOPBACK_HOST_HEADERS) if self.api_host in LOOPBACK_HOSTS else ["*"]

    def workspace_limits(self, workspace: str) -> WorkspaceLimits:
        """The workspace's own limits, else the `default` entry's, else no limits."""
        return self.workspaces.get(workspace) or self.workspaces.get("default") or WorkspaceLimits()

    def model(self, model_id: str) -> ModelConfig | None:
        return next((m for m in self.models if m.id == model_id), None)

    def route(self, route_id: str) -> RouteConfig | None:
        for m in self.models:
            for r in m.routes:
                if r.id == route_id:
                    return r
        return None

    def key_for(self, presented: str) -> ApiKeyConfig | None:
        """The key whose hash matches, compared in constant time against every configured
        hash (no early exit), so response timing says nothing about how close a guess was."""
        digest = hash_key(presented).encode()
        found = None
        for k in self.api_keys:
            if hmac.compare_digest(k.sha256.encode(), digest) and found is None:
                found = k
        return found

    def shipped_dev_keys(self) -> list[str]:
        """Names of configured keys that are public dev keys from the repository's
        backfill.toml (anyone can read them: fine on loopback, never on a network)."""
        dev = {hash_key(key) for key in DEV_KEYS}
        return [k.name or k.key_id for k in self.api_keys if k.sha256 in dev]


FILE_ONLY = frozenset({"models", "limits", "api_keys", "workspaces", "webhooks"})


class _ScalarEnv(EnvSettingsSource):
    """The environment source, minus the structured sections that belong to the file."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        if field_name in FILE_ONLY:
            return None, field_name, False
        return super().get_field_value(field, field_name)


def configured_endpoints(settings: Settings, workspace: str) -> list[WebhookEndpoint]:
    """The workspace's endpoints from the config file (`[[webhooks]]`), read-only through the
    api; the delivery activity and the api both list them this way."""
    return [
        WebhookEndpoint(
            id=w.id,
            url=w.url,
            event_types=w.event_types,
            name=w.name,
            secret_env=w.secret_env,
            source="config",
        )
        for w in settings.webhooks
        if w.workspace == workspace
    ]


def configured_bases(settings: Settings) -> list[str]:
    """The upstream bases whose metrics may be read: GATEWAY_LOCAL_UPSTREAMS and the routes'."""
    routes = [r.base_url for m in settings.models for r in m.routes]
    return approved_bases(settings.gateway_local_upstreams, routes)
