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
