"""Pure helpers of the server-load signal: which metrics URLs may be fetched, and what a model
server's Prometheus text says about its load.

`parse_load` reads vLLM's and SGLang's scheduler gauges with prometheus-client's own text parser:

- waiting: `vllm:num_requests_waiting`, else SGLang's `sglang:num_queue_reqs`;
- running: `vllm:num_requests_running`, else `sglang:num_running_reqs`;
- KV cache: `vllm:kv_cache_usage_perc`, else the older `vllm:gpu_cache_usage_perc`, else
  `sglang:token_usage`; fractions 0-1 (despite `_perc`), reported in percent.

Counts are summed over engines (`engine="0"`, `engine="1"`, SGLang's `dp_rank`, several models);
the KV cache is the fullest engine's. Series that differ only in `pid` (vLLM with several API
processes in prometheus-client multiprocess mode: one copy per process, only one carries the
real value) or in SGLang's `tp_rank`/`pp_rank` (ranks of one engine) are copies of one engine's
value: their maximum counts once. A gauge with a non-finite or negative value is unreadable and
reported as missing, like an absent one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

from prometheus_client.parser import text_string_to_metric_families

from backfill.routes.gates.server_load import LoadReading

__all__ = [
    "approve_metrics_url",
    "approved_bases",
    "metrics_url_for",
    "parse_load",
    "parse_local_upstreams",
]

WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs")
RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs")
KV_CACHE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage")
COPY_LABELS = frozenset({"pid", "tp_rank", "pp_rank"})
"""Labels that tell copies of one engine's value apart (max, not sum)."""

_Values = list[tuple[dict[str, str], float]]
_Series = dict[str, _Values]
_Combine = Callable[[_Values], float]


def parse_load(text: str, read_at: int) -> LoadReading:
    """The load a `/metrics` body reports; malformed text gives a reading with `error` set."""
    wanted = set(WAITING + RUNNING + KV_CACHE)
    series: _Series = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in wanted:
                    series.setdefault(sample.name, []).append((sample.labels, sample.value))
    except Exception as e:  # the text is untrusted: any parser failure means unreadable
        return LoadReading(read_at=read_at, error=f"malformed metrics text: {_short(e)}")
    kv = _first(series, KV_CACHE, _highest)
    return LoadReading(
        waiting=_first(series, WAITING, _engine_sum),
        running=_first(series, RUNNING, _engine_sum),
        kv_cache_percent=None if kv is None else kv * 100.0,
        read_at=read_at,
    )


def _first(series: _Series, names: tuple[str, ...], combine: _Combine) -> float | None:
    for name in names:
        if name in series:
            values = series[name]
            if any(not math.isfinite(v) or v < 0 for _, v in values):
                return None
            return combine(values)
    return None


def _engine_sum(values: _Values) -> float:
    engines: dict[tuple[tuple[str, str], ...], float] = {}
    for labels, value in values:
        key = tuple(sorted((k, v) for k, v in labels.items() if k not in COPY_LABELS))
        engines[key] = max(engines.get(key, 0.0), value)
    return sum(engines.values())


def _highest(values: _Values) -> float:
    return max(v for _, v in values)


def _short(e: Exception) -> str:
    text = str(e) or type(e).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def metrics_url_for(base_url: str) -> str:
    """`http://host:8000/v1` -> `http://host:8000/metrics`; ValueError if it does not end in /v1."""
    base = base_url.rstrip("/")
    if not base.endswith("/v1"):
        raise ValueError(f"upstream base URL {base_url!r} does not end with /v1")
    return base[: -len("/v1")] + "/metrics"


def parse_local_upstreams(value: str | None) -> list[str]:
    """The base URLs in `GATEWAY_LOCAL_UPSTREAMS` (comma-separated, each ending in /v1)."""
    bases = [part.strip() for part in (value or "").split(",") if part.strip()]
    for base in bases:
        metrics_url_for(base)  # refuse a malformed entry at start, naming it
        if urlsplit(base).scheme not in ("http", "https"):
            raise ValueError(f"GATEWAY_LOCAL_UPSTREAMS: {base!r} is not an http(s) URL")
    return bases


def approved_bases(local_upstreams: str | None, route_base_urls: Iterable[str]) -> list[str]:
    """The upstream bases whose metrics may be read: `GATEWAY_LOCAL_UPSTREAMS` (its value, read
    by the caller) together with the configured routes' base URLs."""
    return list(dict.fromkeys([*parse_local_upstreams(local_upstreams), *route_base_urls]))


def approve_metrics_url(url: str, approved_bases: Iterable[str]) -> str:
    """`url` if it is an approved upstream base without its final `/v1`, plus `/metrics`;
    otherwise ValueError saying which URLs are allowed. Scheme and host compare
    case-insensitively, everything else exactly. Bases not ending in /v1 approve nothing."""
    allowed: list[str] = []
    for base in approved_bases:
        try:
            allowed.append(metrics_url_for(base))
        except ValueError:
            continue
    key = _compare_key(url)
    if key is not None and any(_compare_key(a) == key for a in allowed):
        return url
    if not allowed:
        raise ValueError(
            f"metrics URL {url!r} is not allowed: no upstream is approved "
            "(set GATEWAY_LOCAL_UPSTREAMS or configure the route's base_url)"
        )
    raise ValueError(
        f"metrics URL {url!r} is not allowed: it must be an approved upstream base without "
        f"its /v1, plus /metrics: one of {', '.join(sorted(set(allowed)))}"
    )


def _compare_key(url: str) -> tuple[str, str, int | None, str] | None:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if parts.username is not None or parts.password is not None or parts.query or parts.fragment:
        return None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        return None
    default = 443 if parts.scheme.lower() == "https" else 80
    return (parts.scheme.lower(), parts.hostname.lower(), port or default, parts.path)
