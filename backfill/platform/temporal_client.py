"""One way to connect to Temporal, shared by the api, the worker and tests."""

from __future__ import annotations

from collections.abc import Sequence

from temporalio.client import Client, Interceptor, TLSConfig
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig
from temporalio.service import RetryConfig

from backfill.platform.config import Settings


async def connect(
    settings: Settings,
    *,
    metrics_bind: str | None = None,
    interceptors: Sequence[Interceptor] = (),
    retry_config: RetryConfig | None = None,
) -> Client:
    """Connect with the pydantic data converter, TLS and API key as configured.

    `metrics_bind` ("127.0.0.1:9464") exposes the SDK's own Prometheus metrics; the api passes
    `interceptors` and `retry_config` that bound its calls (`api.temporal_link`)."""
    tls: TLSConfig | bool = settings.temporal_tls
    if settings.temporal_tls_cert and settings.temporal_tls_key:
        tls = TLSConfig(
            client_cert=settings.temporal_tls_cert.read_bytes(),
            client_private_key=settings.temporal_tls_key.read_bytes(),
        )
    runtime = None
    if metrics_bind:
        runtime = Runtime(
            telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=metrics_bind))
        )
    return await Client.connect(
        settings.temporal_address,
        namespace=settings.temporal_namespace,
        api_key=settings.temporal_api_key,
        tls=tls,
        data_converter=pydantic_data_converter,
        runtime=runtime,
        interceptors=interceptors,
        retry_config=retry_config,
    )
