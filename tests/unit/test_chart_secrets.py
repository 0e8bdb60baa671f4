"""The Helm chart carries every secret backfill reads (issue 40; the preemption channel's token
is issue 34's): `BACKFILL_WEBHOOK_KEY` from an existing Secret or from a value the chart keeps in
a Secret of its own, given to the api and to the workers that sign, never to a workflows-only
worker nor the ConfigMap; the configured endpoints' secrets; the Temporal API key as a value."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from tests.unit.test_deploy import (
    SPLIT_VALUES,
    all_documents,
    by_kind_and_name,
    pod_parts,
    render_chart,
)

KEY = "0123456789abcdef0123456789abcdef0123456789abcdef"


def _secret_ref(env: dict[str, Any], name: str) -> tuple[str, str]:
    assert "value" not in env[name], f"{name} in clear"
    ref = env[name]["valueFrom"]["secretKeyRef"]
    return ref["name"], ref["key"]


def test_the_webhook_key_from_an_existing_secret_reaches_the_api_and_the_signing_workers() -> None:
    hooks = {"webhooks": {"key": {"existingSecret": "hooks", "key": "master"}}}
    docs = by_kind_and_name(hooks)
    for name in ("backfill-api", "backfill-worker"):
        _, env, _ = pod_parts(docs[("Deployment", name)])
        assert _secret_ref(env, "BACKFILL_WEBHOOK_KEY") == ("hooks", "master"), name
    assert ("Secret", "backfill-secrets") not in docs  # nothing to keep
    split = by_kind_and_name({**SPLIT_VALUES, **hooks})
    _, env, _ = pod_parts(split[("Deployment", "backfill-worker-activities")])
    assert _secret_ref(env, "BACKFILL_WEBHOOK_KEY") == ("hooks", "master")
    _, env, _ = pod_parts(split[("Deployment", "backfill-worker-workflows")])
    assert "BACKFILL_WEBHOOK_KEY" not in env  # it signs nothing


def test_the_webhook_key_as_a_value_is_kept_in_a_secret_of_the_charts() -> None:
    docs = by_kind_and_name({"webhooks": {"key": {"value": KEY}}})
    secret = docs[("Secret", "backfill-secrets")]
    assert base64.b64decode(secret["data"]["webhook-key"]).decode() == KEY
    for name in ("backfill-api", "backfill-worker"):
        _, env, _ = pod_parts(docs[("Deployment", name)])
        assert _secret_ref(env, "BACKFILL_WEBHOOK_KEY") == ("backfill-secrets", "webhook-key")
    everything_else = [
        d for d in all_documents(render_chart({"webhooks": {"key": {"value": KEY}}}))
    ]
    shown = json.dumps([d for d in everything_else if d["kind"] != "Secret"])
    assert KEY not in shown and base64.b64encode(KEY.encode()).decode() not in shown


def test_a_short_webhook_key_fails_the_render() -> None:
    with pytest.raises(Exception, match="at least 32"):
        render_chart({"webhooks": {"key": {"value": "too-short"}}})


def test_configured_endpoint_secrets_go_to_the_signing_workers_only() -> None:
    docs = by_kind_and_name(
        {
            "webhooks": {"endpointSecrets": {"existingSecret": "hook-secrets"}},
            "upstreamKeys": {"existingSecret": "model-keys"},
        }
    )
    api, _, _ = pod_parts(docs[("Deployment", "backfill-api")])
    worker, _, _ = pod_parts(docs[("Deployment", "backfill-worker")])
    assert api["envFrom"] == [{"secretRef": {"name": "model-keys"}}]
    assert worker["envFrom"] == [
        {"secretRef": {"name": "model-keys"}},
        {"secretRef": {"name": "hook-secrets"}},
    ]


def test_the_temporal_api_key_may_be_a_value_too() -> None:
    docs = by_kind_and_name({"temporal": {"apiKey": {"value": "tmprl-key"}}})
    secret = docs[("Secret", "backfill-secrets")]
    assert base64.b64decode(secret["data"]["temporal-api-key"]).decode() == "tmprl-key"
    _, env, _ = pod_parts(docs[("Deployment", "backfill-api")])
    assert _secret_ref(env, "TEMPORAL_API_KEY") == ("backfill-secrets", "temporal-api-key")


@pytest.mark.parametrize(
    "values",
    [
        {"webhooks": {"key": {"value": KEY}, "endpointSecrets": {"existingSecret": "h"}}},
        {**SPLIT_VALUES, "webhooks": {"key": {"existingSecret": "hooks"}}},
        {"temporal": {"apiKey": {"value": "k"}}, "webhooks": {"key": {"value": KEY}}},
    ],
    ids=["value", "split-existing", "both-values"],
)
def test_the_secret_manifests_match_the_kubernetes_schemas(values: dict[str, Any]) -> None:
    import kubernetes_validate

    version = kubernetes_validate.latest_version()
    for doc in all_documents(render_chart(values)):
        kubernetes_validate.validate(doc, version, strict=True)
