"""The server-load gate: its settings, one reading of the model server's load, and the decision.

Pure (pydantic only, no I/O, no clock). Its reader is the `watch_server_load` activity: it reads
the server's `/metrics` (`backfill.upstream.load_reader.ServerLoadReader`), calls `judge` on each
`LoadReading` and signals the route scheduler the `LoadVerdict` when its state changes; the
scheduler's `decide` reads the last verdict. It fails closed: no reading, an unreadable one, or a
missing gauge that has a limit closes the gate as "Server metrics unavailable" (decision 0011).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from backfill.routes.gates import base
from backfill.routes.gates.base import (
    OPEN,
    FormField,
    Gate,
    GateAnswer,
    GateContext,
    GateEntry,
    GateSignal,
    Reader,
)
from backfill.routes.reasons import WaitReason

__all__ = [
    "ENTRY",
    "GateState",
    "LoadReading",
    "LoadVerdict",
    "ServerLoadSettings",
    "WatchLoadInput",
    "judge",
]

MAX_COUNT_LIMIT = 100_000

GateState = Literal["open", "busy", "unavailable"]


class ServerLoadSettings(BaseModel):
    """The settings document's `server_load`: a metrics URL and at least one limit.

    Whether the URL is an approved upstream's is checked where the setting is saved
    (`backfill.upstream.load_metrics.approve_metrics_url`), and again by the reader before any
    fetch."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

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


class LoadVerdict(BaseModel):
    """The server-load watcher's verdict, signalled when it changes (`server_load` signal)."""

    state: GateState
    """`open`: every limit holds; `busy`: over a limit; `unavailable`: cannot tell."""
    detail: str | None = None
    """What exactly: the limit exceeded, the missing gauge or the error text; None when open."""
    reading: LoadReading | None = None
    """The reading it was judged on."""


def judge(settings: ServerLoadSettings, reading: LoadReading | None) -> LoadVerdict:
    """Whether new batch lines may start given the latest `reading` (None: none yet)."""
    if reading is None:
        return LoadVerdict(state="unavailable", detail="no reading yet")
    if reading.error is not None:
        return LoadVerdict(state="unavailable", detail=reading.error, reading=reading)
    checks = (
        ("waiting requests", settings.max_waiting, reading.waiting, ""),
        ("running requests", settings.max_running, reading.running, ""),
        ("KV cache use", settings.max_kv_cache_percent, reading.kv_cache_percent, "%"),
    )
    missing = [name for name, limit, value, _ in checks if limit is not None and value is None]
    if missing:
        detail = f"the server reports no {' or '.join(missing)} gauge"
        return LoadVerdict(state="unavailable", detail=detail, reading=reading)
    over = [
        f"{name} {value:g}{unit} > {limit}{unit}"
        for name, limit, value, unit in checks
        if limit is not None and value is not None and value > limit
    ]
    if over:
        return LoadVerdict(state="busy", detail="; ".join(over), reading=reading)
    return LoadVerdict(state="open", reading=reading)


class WatchLoadInput(BaseModel):
    """The server-load watcher of one route (a long-running activity, while lines wait)."""

    route_id: str
    settings: ServerLoadSettings


STATE = base.GateState(
    key="load", type=LoadVerdict | None, initial=lambda: None, reset_on_change=True
)
"""The watcher's last verdict (None: none since the signal was set: closed)."""


def verdict(ctx: GateContext) -> LoadVerdict | None:
    """The watcher's last verdict (seat-aware admission reads its reading too)."""
    return ctx.state_of(STATE)  # type: ignore[no-any-return]


def decide(setting: ServerLoadSettings, ctx: GateContext) -> GateAnswer:
    """The watcher's last verdict: closed while busy or unknown (no verdict yet: unknown)."""
    load = verdict(ctx)
    if load is None:
        return GateAnswer(False, WaitReason.METRICS, detail="no reading yet")
    if load.state == "unavailable":
        return GateAnswer(False, WaitReason.METRICS, detail=load.detail)
    if load.state == "busy":
        return GateAnswer(False, WaitReason.BUSY, detail=load.detail)
    return OPEN


LIMITS = ("max_waiting", "max_running", "max_kv_cache_percent")


def _status(load: LoadVerdict | None, gate: Gate, now: float) -> Mapping[str, Any]:
    """The reading the last verdict was judged on: the route status shows what the scheduler
    read, and the api never reads the model server's metrics itself."""
    return {"server_load": load.reading if load is not None else None}


def _summary(s: ServerLoadSettings) -> str:
    limits = [f", {k} {getattr(s, k)}" for k in LIMITS if getattr(s, k) is not None]
    return s.metrics_url + "".join(limits)


ENTRY = GateEntry(
    name="server_load",
    label="Server load signal",
    model=ServerLoadSettings,
    decide=decide,
    doc='"Server load signal": lines start only while the server\'s own metrics are under every '
    "limit set (fails closed; null: off).",
    summary=_summary,
    form=(
        FormField("metrics_url", "Metrics URL (blank: off)", numeric=False),
        FormField("max_waiting", "Max waiting requests"),
        FormField("max_running", "Max running requests"),
        FormField("max_kv_cache_percent", "Max KV cache %"),
    ),
    state=STATE,
    signals=(GateSignal("server_load", LoadVerdict, lambda _, v, now: v),),
    reader=Reader(
        "watch_server_load",
        lambda route_id, setting: WatchLoadInput(route_id=route_id, settings=setting),
    ),
    status=_status,
)
