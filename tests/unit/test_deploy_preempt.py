"""The Helm chart's side of preemptive yield and the metrics ports (issue 34): by default only
the monitoring namespace may scrape the metrics ports, which name workspaces and batches."""

from __future__ import annotations

from tests.unit.test_deploy import all_documents, render_chart

MONITORING = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}


def network_policies(values: dict[str, object] | None = None) -> dict[str, dict[str, object]]:
    return {
        d["metadata"]["name"]: d["spec"]
        for d in all_documents(render_chart(values))
        if d["kind"] == "NetworkPolicy"
    }


def metrics_sources(spec: dict[str, object]) -> list[object]:
    ingress = spec["ingress"]
    assert isinstance(ingress, list)
    return [
        source
        for rule in ingress
        if any(p["port"] == "metrics" for p in rule["ports"])
        for source in rule.get("from", [{}])  # no `from`: anyone
    ]


def test_by_default_only_the_monitoring_namespace_scrapes() -> None:
    for name, spec in network_policies().items():
        assert metrics_sources(spec) == [MONITORING], name


def test_the_preempt_token_comes_from_a_secret_and_the_api_reaches_the_workers() -> None:
    values = {"preempt": {"existingSecret": "backfill-preempt", "key": "token"}}
    docs = {(d["kind"], d["metadata"]["name"]): d for d in all_documents(render_chart(values))}
    for name in ("backfill-api", "backfill-worker"):
        [container] = docs[("Deployment", name)]["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e for e in container["env"]}
        assert env["BACKFILL_PREEMPT_TOKEN"]["valueFrom"] == {
            "secretKeyRef": {"name": "backfill-preempt", "key": "token"}
        }
        assert "BACKFILL_PREEMPT_WORKER_URLS" not in env  # found on the task queue
    policies = network_policies(values)
    api_pods = {
        "podSelector": {
            "matchLabels": {
                "app.kubernetes.io/name": "backfill",
                "app.kubernetes.io/instance": "backfill",
                "app.kubernetes.io/component": "api",
            }
        }
    }
    worker_pods = {
        "podSelector": {
            "matchLabels": {
                **api_pods["podSelector"]["matchLabels"],
                "app.kubernetes.io/component": "worker",
            }
        }
    }
    assert metrics_sources(policies["backfill-worker"]) == [MONITORING, api_pods, worker_pods]
    egress = policies["backfill-api"]["egress"]
    assert isinstance(egress, list)
    assert egress[-1]["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    # Without the Secret: no token, and the workers take scrapes only.
    plain = {(d["kind"], d["metadata"]["name"]): d for d in all_documents(render_chart())}
    [container] = plain[("Deployment", "backfill-worker")]["spec"]["template"]["spec"]["containers"]
    assert "BACKFILL_PREEMPT_TOKEN" not in {e["name"] for e in container["env"]}
