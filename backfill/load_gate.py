"""The server-load gate: its settings, one reading of the model server's load, and the decision.

Pure (pydantic only, no I/O, no clock): the route scheduler calls `load_gate` with the latest
`LoadReading` (read by `backfill.load_reader.ServerLoadReader`). It fails closed:
no reading, an unreadable one, or a missing gauge that has a limit closes the gate as
"Server metrics unavailable" (decision 0011).
"""

from __future__ import annotations

from typing import Literal, NamedTuple
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from backfill.reasons import WaitReason

__all__ = [
    "SERVER_BUSY",
    "SERVER_METRICS_UNAVAILABLE",
    "GateState",
    "LoadDecision",
    "LoadReading",
    "ServerLoadSettings",
    "load_gate",
]

SERVER_BUSY = WaitReason.BUSY
SERVER_METRICS_UNAVAILABLE = WaitReason.METRICS
MAX_COUNT_LIMIT = 100_000

GateState = Literal["open", "busy", "unavailable"]


class ServerLoadSettings(BaseModel):
    """The settings document's `server_load`: a metrics URL and at least one limit.

    Whether the URL is an approved upstream's is checked where the setting is saved
    (`backfill.load_metrics.approve_metrics_url`), and again by the reader before any fetch."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    metrics_url: str = Field(max_length=2048)
    """`http(s)://host[:port][/prefix]/metrics`: an approved upstream base without its `/v1`."""
    max_waiting: int | None = Field(default=None, ge=0, le=MAX_COUNT_LIMIT)
    """Busy while more requests than this wait (summed over engines); None: no limit."""
    max_running: int | None = Field(default=None, ge=0, le=MAX_COUNT_LIMIT)
    """Busy while more requests than this run (summed over engines); None: no limit."""
    max_kv_cache_percent: int | None = Field(default=None, ge=1, le=100)
    """Busy while the fullest engine's KV cache is above this percentage; None: no limit."""

    @field_validator("metrics_url")
    @classmethod
    def _metrics_url_shape(cls, value: str) -> str:
        try:
            parts = urlsplit(value)
            parts.port  # noqa: B018  # raises ValueError on a bad port
        except ValueError:
            raise ValueError(f"not a valid URL: {value!r}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL with a host")
        if parts.username is not None or parts.password is not None:
            raise ValueError("must not carry credentials")
        if parts.query or parts.fragment:
            raise ValueError("must not have a query or fragment")
        if not parts.path.endswith("/metrics"):
            raise ValueError("must end with /metrics (the upstream base without /v1, + /metrics)")
        return value

    @model_validator(mode="after")
    def _some_limit(self) -> ServerLoadSettings:
        if self.max_waiting is None and self.max_running is None:
            if self.max_kv_cache_percent is None:
                raise ValueError(
                    "set at least one limit: max_waiting, max_running or max_kv_cache_percent"
                )
        return self


class LoadReading(BaseModel):
    """One reading of a model server's `/metrics` (the route status's `server_load`)."""

    model_config = ConfigDict(frozen=True)

    waiting: float | None = None
    """Requests waiting, summed over engines; None: no such gauge (or an unreadable one)."""
    running: float | None = None
    """Requests running, summed over engines; None: no such gauge."""
    kv_cache_percent: float | None = None
    """KV-cache use of the fullest engine, in percent (0-100); None: no such gauge."""
    read_at: int
    """When the reading was taken (Unix seconds)."""
    error: str | None = None
    """Why the metrics could not be read (then every value is None)."""


class LoadDecision(NamedTuple):
    state: GateState
    """`open`: every limit holds; `busy`: over a limit; `unavailable`: cannot tell."""
    reason: str | None
    """The route's pause reason (`SERVER_BUSY`, `SERVER_METRICS_UNAVAILABLE`); None when open."""
    detail: str | None
    """What exactly: the limit exceeded, the missing gauge or the error text; None when open."""


def load_gate(settings: ServerLoadSettings, reading: LoadReading | None) -> LoadDecision:
    """Whether new batch lines may start given the latest `reading` (None: none yet)."""
    if reading is None:
        return LoadDecision("unavailable", SERVER_METRICS_UNAVAILABLE, "no reading yet")
    if reading.error is not None:
        return LoadDecision("unavailable", SERVER_METRICS_UNAVAILABLE, reading.error)
    checks = (
        ("waiting requests", settings.max_waiting, reading.waiting, ""),
        ("running requests", settings.max_running, reading.running, ""),
        ("KV cache use", settings.max_kv_cache_percent, reading.kv_cache_percent, "%"),
    )
    missing = [name for name, limit, value, _ in checks if limit is not None and value is None]
    if missing:
        detail = f"the server reports no {' or '.join(missing)} gauge"
        return LoadDecision("unavailable", SERVER_METRICS_UNAVAILABLE, detail)
    over = [
        f"{name} {value:g}{unit} > {limit}{unit}"
        for name, limit, value, unit in checks
        if limit is not None and value is not None and value > limit
    ]
    if over:
        return LoadDecision("busy", SERVER_BUSY, "; ".join(over))
    return LoadDecision("open", None, None)
