"""Typed configuration: process settings from the environment plus the TOML file.

The TOML file (``backfill.toml`` unless ``BACKFILL_CONFIG`` names another) declares models and
their routes (with their scheduling settings, if any), limits, the data directory and API keys
(as SHA-256 hashes). Environment variables win over the file for the process settings (Temporal
address, namespace, TLS, API key, ports), so one file can serve a laptop and a cluster. Unknown
or invalid fields fail at start with a message naming the field.

One module per concern: `sections` (the file's tables), `settings` (`Settings`), `loading`
(reading and validating), `checks` (checks at start), `dev` (the public dev keys). Import from
`backfill.platform.config`.
"""

from backfill.platform.config.checks import (
    UnsafeConfig,
    check_exposure,
    missing_upstream_keys,
    warn_missing_upstream_keys,
)
from backfill.platform.config.dev import (
    DEV_KEY,
    DEV_KEYS,
    LOOPBACK_HOST_HEADERS,
    LOOPBACK_HOSTS,
    hash_key,
)
from backfill.platform.config.loading import ConfigError, config_path, get_settings, load_settings
from backfill.platform.config.sections import (
    MIN_WEBHOOK_KEY_LENGTH,
    ApiKeyConfig,
    BodyField,
    Limits,
    ModelConfig,
    Provider,
    Role,
    RouteConfig,
    WebhookConfig,
    WorkerRole,
    WorkspaceLimits,
)
from backfill.platform.config.settings import (
    FILE_ONLY,
    Settings,
    configured_bases,
    configured_endpoints,
)

__all__ = [
    "DEV_KEY",
    "DEV_KEYS",
    "FILE_ONLY",
    "LOOPBACK_HOSTS",
    "LOOPBACK_HOST_HEADERS",
    "MIN_WEBHOOK_KEY_LENGTH",
    "ApiKeyConfig",
    "BodyField",
    "ConfigError",
    "Limits",
    "ModelConfig",
    "Provider",
    "Role",
    "RouteConfig",
    "Settings",
    "UnsafeConfig",
    "WebhookConfig",
    "WorkerRole",
    "WorkspaceLimits",
    "check_exposure",
    "config_path",
    "configured_bases",
    "configured_endpoints",
    "get_settings",
    "hash_key",
    "load_settings",
    "missing_upstream_keys",
    "warn_missing_upstream_keys",
]
