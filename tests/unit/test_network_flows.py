"""Every process-to-process flow backfill makes, against the Helm chart's NetworkPolicies.

`FLOWS` is the one table: who connects to whom, on which port (read from the code's settings as
the chart renders them, or their defaults), opened by which code, and when. The test renders the
chart and evaluates the rendered NetworkPolicies (Kubernetes' rules: a pod selected by a policy
of a type allows only what some rule of that type admits; named ports resolve on the
destination pod) for each flow, from the source's egress and the destination's ingress. It is
tied to the code both ways: every module that opens a network connection must be the opener of
some flow (or be listed, with why, in `NOT_FLOWS`), and every port a process listens on (a
`*_port` setting) must be some flow's destination; so a flow added to the code without its row,
or a row without its NetworkPolicy rule, fails here. docs/operator-guide.md ("Network flows")
is this table, row for row.
"""

from __future__ import annotations

import ipaddress
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import pytest

from backfill.platform.config import Settings
from tests.unit.test_deploy import ROOT, all_documents, render_chart

NAMESPACE = "batch"
"""Where `render_chart` installs the release."""


@dataclass(frozen=True)
class Flow:
    name: str
    """As docs/operator-guide.md names it."""
    source: str
    dest: str
    port: str
    """A setting (`api_port`: the destination's variable as rendered, else the code's
    default), a variable of the source (`TEMPORAL_ADDRESS`: host:port or a URL), `base_url` (the
    routes' model servers in the rendered backfill.toml), or a number."""
    opened_by: tuple[str, ...]
    """The modules that open the connection (none: a client outside backfill)."""
    when: str = "always"
    """`always`, or the chart values it needs: `preempt`, `s3`, `egress.extra`."""
    protocol: str = "TCP"


FLOWS = [
    Flow("clients to the api", "client", "api", "api_port", ()),
    Flow("Prometheus to the api", "prometheus", "api", "api_metrics_port", ()),
    Flow("Prometheus to the workers", "prometheus", "worker", "worker_metrics_port", ()),
    Flow(
        "api to Temporal",
        "api",
        "temporal",
        "TEMPORAL_ADDRESS",
        ("backfill/platform/temporal_client.py",),
    ),
    Flow(
        "workers to Temporal",
        "worker",
        "temporal",
        "TEMPORAL_ADDRESS",
        ("backfill/platform/temporal_client.py",),
    ),
    Flow(
        "api to the model servers",
        "api",
        "model-server",
        "base_url",
        ("api/app.py",),
    ),
    Flow(
        "workers to the model servers",
        "activity-worker",
        "model-server",
        "base_url",
        ("worker/upstream.py", "backfill/upstream/load_reader.py"),
    ),
    Flow("api to DNS", "api", "dns", "53", (), protocol="UDP"),
    Flow("workers to DNS", "worker", "dns", "53", (), protocol="UDP"),
    Flow(
        "api to the workers' channel",
        "api",
        "activity-worker",
        "worker_metrics_port",
        ("api/preemption/push.py",),
        when="preempt",
    ),
    Flow(
        "workers to the workers' channel",
        "activity-worker",
        "activity-worker",
        "worker_metrics_port",
        ("worker/preemption/peers.py",),
        when="preempt",
    ),
    Flow(
        "api to S3",
        "api",
        "external",
        "BACKFILL_S3_ENDPOINT_URL",
        ("backfill/files/s3_objects.py",),
        when="s3, egress.extra",
    ),
    Flow(
        "workers to S3",
        "activity-worker",
        "external",
        "BACKFILL_S3_ENDPOINT_URL",
        ("backfill/files/s3_objects.py",),
        when="s3, egress.extra",
    ),
    Flow(
        "workers to webhook endpoints",
        "activity-worker",
        "external",
        "443",
        ("activities/webhooks.py",),
        when="egress.extra",
    ),
    Flow(
        "api to a trace collector",
        "api",
        "external",
        "4318",
        ("backfill/platform/tracing.py",),
        when="egress.extra",
    ),
    Flow(
        "workers to a trace collector",
        "worker",
        "external",
        "4318",
        ("backfill/platform/tracing.py",),
        when="egress.extra",
    ),
]

NOT_FLOWS = {
    "backfill/operations/doctor.py": "`backfill doctor`, run by an operator: it makes the flows of "
    "the api and the workers (Temporal, the model servers) from wherever it runs",
    "worker/metrics_server.py": "reads the Temporal SDK's metrics on the pod's loopback",
}
"""Modules that open connections that are no flow between pods."""

CONNECTS = re.compile(
    r"httpx\.(Async)?Client\(|\(httpx\.(Async)?Client\)|httpcore\.(Async)?ConnectionPool\("
    r"|urlopen\(|boto3\.|Client\.connect\(|create_connection\(|open_connection\("
    r"|OTLPSpanExporter\(|socket\.socket\("
)
"""What opening a network connection looks like in the code."""

EXTERNAL = "203.0.113.10"
"""S3, the webhook endpoints, the trace collector: outside the cluster (TEST-NET-3)."""
VALUES: dict[str, Any] = {
    "preempt": {"existingSecret": "backfill-preempt"},
    "fileStore": {"type": "s3", "s3": {"bucket": "b", "endpoint": "https://s3.example.test"}},
    "networkPolicy": {
        "egress": {
            "extra": [
                {
                    "to": [{"ipBlock": {"cidr": "203.0.113.0/24"}}],
                    "ports": [{"port": 443, "protocol": "TCP"}, {"port": 4318, "protocol": "TCP"}],
                }
            ]
        }
    },
}
"""Every flow on: preemption, the S3 store, and the egress an operator adds for what is outside
the cluster (docs/operator-guide.md says which)."""


@dataclass(frozen=True)
class Endpoint:
    namespace: str | None
    """None: outside the cluster."""
    ip: str
    labels: Mapping[str, str] = field(default_factory=dict)
    ports: Mapping[str, int] = field(default_factory=dict)
    """The pod's named container ports."""
    env: Mapping[str, str] = field(default_factory=dict)


def pod(deployment: dict[str, Any], ip: str) -> Endpoint:
    template = deployment["spec"]["template"]
    [container] = template["spec"]["containers"]
    return Endpoint(
        NAMESPACE,
        ip,
        template["metadata"]["labels"],
        {p["name"]: p["containerPort"] for p in container.get("ports", [])},
        {e["name"]: e["value"] for e in container["env"] if "value" in e},
    )


def endpoints(docs: list[dict[str, Any]]) -> dict[str, list[Endpoint]]:
    """Each name in `FLOWS` as pods (every worker Deployment is a `worker`; those that run
    lines, every one unless `worker.split`, an `activity-worker`)."""
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    workers = [d for d in deployments if d["metadata"]["name"].startswith("backfill-worker")]
    [api] = [d for d in deployments if d["metadata"]["name"] == "backfill-api"]
    return {
        "api": [pod(api, "10.1.0.1")],
        "worker": [pod(w, f"10.1.1.{k + 1}") for k, w in enumerate(workers)],
        "activity-worker": [  # the workers that run lines (all of them unless split)
            pod(w, f"10.1.1.{k + 1}")
            for k, w in enumerate(workers)
            if w["spec"]["template"]["metadata"]["labels"].get("backfill.io/worker-role")
            != "workflows"
        ],
        "client": [Endpoint("ingress", "10.1.9.1", {"app": "ingress-controller"})],
        "prometheus": [Endpoint("monitoring", "10.1.8.1", {"app": "prometheus"})],
        "temporal": [Endpoint("temporal", "10.2.0.1", {"app": "temporal-frontend"})],
        "dns": [Endpoint("kube-system", "10.96.0.10", {"k8s-app": "kube-dns"})],
        "model-server": [Endpoint(model_namespace(docs), "10.3.0.1", {"app": "vllm"})],
        "external": [Endpoint(None, EXTERNAL)],
    }


def config(docs: list[dict[str, Any]]) -> dict[str, Any]:
    [cm] = [d for d in docs if d["kind"] == "ConfigMap" and "backfill.toml" in d.get("data", {})]
    return tomllib.loads(cm["data"]["backfill.toml"])


def model_urls(docs: list[dict[str, Any]]) -> list[str]:
    return [r["base_url"] for m in config(docs)["models"] for r in m["routes"]]


def model_namespace(docs: list[dict[str, Any]]) -> str:
    """The namespace of the routes' model server (`<service>.<namespace>.svc...`)."""
    [namespace] = {(urlsplit(u).hostname or "").split(".")[1] for u in model_urls(docs)}
    return namespace


def url_port(url: str) -> int:
    parts = urlsplit(url)
    return parts.port or {"https": 443, "http": 80}[parts.scheme]


def port_of(flow: Flow, source: Endpoint, dest: Endpoint, docs: list[dict[str, Any]]) -> int:
    if flow.port.isdigit():
        return int(flow.port)
    if flow.port == "base_url":
        [port] = {url_port(u) for u in model_urls(docs)}
        return port
    if flow.port.isupper():  # the source's variable: host:port or a URL
        value = source.env[flow.port]
        return url_port(value) if "://" in value else int(value.rpartition(":")[2])
    setting = Settings.model_fields[flow.port]
    alias = setting.validation_alias
    assert isinstance(alias, str)
    value = dest.env.get(alias, setting.default)
    assert value is not None, f"{flow.name}: {alias} is not set and has no default"
    return int(value)


def selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, selector  # the chart uses no expressions
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def peer_admits(peer: Mapping[str, Any], policy_namespace: str, other: Endpoint) -> bool:
    if "ipBlock" in peer:
        block = peer["ipBlock"]
        address = ipaddress.ip_address(other.ip)
        return address in ipaddress.ip_network(block["cidr"]) and not any(
            address in ipaddress.ip_network(e) for e in block.get("except", [])
        )
    if other.namespace is None:
        return False
    if "namespaceSelector" in peer:
        namespace_labels = {"kubernetes.io/metadata.name": other.namespace}
        if not selects(peer["namespaceSelector"], namespace_labels):
            return False
    elif other.namespace != policy_namespace:
        return False
    return selects(peer.get("podSelector", {}), other.labels)


def ports_admit(ports: list[Mapping[str, Any]], port: int, protocol: str, dest: Endpoint) -> bool:
    for p in ports or [{}]:
        if p.get("protocol", "TCP") != protocol:
            continue
        if "port" not in p:
            return True
        number = dest.ports.get(p["port"]) if isinstance(p["port"], str) else p["port"]
        if number is not None and number <= port <= p.get("endPort", number):
            return True
    return False


def admitted(
    policies: list[dict[str, Any]],
    source: Endpoint,
    dest: Endpoint,
    port: int,
    protocol: str,
) -> bool:
    """Whether the rendered policies let `source` open `port` on `dest`: its egress, then the
    destination's ingress (a pod no policy of that type selects is not restricted)."""
    for kind, side, other, key in (
        ("Egress", source, dest, "to"),
        ("Ingress", dest, source, "from"),
    ):
        if side.namespace != NAMESPACE:
            continue  # not a pod of the release: the chart's policies do not apply
        applying = [
            p["spec"]
            for p in policies
            if kind in p["spec"].get("policyTypes", ["Ingress"])
            and selects(p["spec"]["podSelector"], side.labels)
        ]
        if applying and not any(
            ports_admit(rule.get("ports", []), port, protocol, dest)
            and (not rule.get(key) or any(peer_admits(q, NAMESPACE, other) for q in rule[key]))
            for spec in applying
            for rule in spec.get(kind.lower(), [])
        ):
            return False
    return True


def check(values: dict[str, Any]) -> list[str]:
    """The flows the chart rendered with `values` does not admit."""
    docs = all_documents(render_chart(values))
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    assert policies, "no NetworkPolicy rendered"
    pods = endpoints(docs)
    refused = []
    for flow in FLOWS:
        for source in pods[flow.source]:
            for dest in pods[flow.dest]:  # the same Deployment too: its other replicas
                port = port_of(flow, source, dest, docs)
                if not admitted(policies, source, dest, port, flow.protocol):
                    refused.append(f"{flow.name}: {source.ip} -> {dest.ip}:{port}")
    return refused


@pytest.mark.parametrize("split", [False, True], ids=["one-worker-kind", "split-workers"])
def test_the_chart_admits_every_flow_the_code_makes(split: bool) -> None:
    values = {**VALUES, "worker": {"split": {"enabled": split}}}
    assert check(values) == []


def test_the_policies_refuse_what_is_no_flow() -> None:
    """The evaluation has teeth: flows that no row names are refused by the same policies."""
    docs = all_documents(render_chart(VALUES))
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    pods = endpoints(docs)
    api, [worker, other_worker] = pods["api"][0], pods["activity-worker"] * 2
    model, outside = pods["model-server"][0], pods["external"][0]
    metrics = worker.ports["metrics"]
    assert not admitted(policies, model, worker, metrics, "TCP")  # a model server: no way in
    assert not admitted(policies, pods["client"][0], worker, metrics, "TCP")
    assert not admitted(policies, model, api, api.ports["metrics"], "TCP")  # only Prometheus
    assert not admitted(policies, api, outside, 8080, "TCP")  # only the egress added
    assert admitted(policies, worker, other_worker, metrics, "TCP")
    # Without preemption, the channel's flows are closed.
    plain = [d for d in all_documents(render_chart()) if d["kind"] == "NetworkPolicy"]
    assert not admitted(plain, api, worker, metrics, "TCP")
    assert not admitted(plain, worker, other_worker, metrics, "TCP")


def modules_that_connect() -> set[str]:
    found = set()
    for package in ("api", "worker", "activities", "backfill", "workflows"):
        for path in (ROOT / package).rglob("*.py"):
            if CONNECTS.search(path.read_text()):
                found.add(str(path.relative_to(ROOT)))
    return found


def test_every_module_that_connects_opens_a_flow_of_the_table() -> None:
    opened = {m for f in FLOWS for m in f.opened_by}
    assert opened <= modules_that_connect(), "a row names code that opens no connection"
    unlisted = modules_that_connect() - opened - set(NOT_FLOWS)
    assert not unlisted, f"connections not in FLOWS (add the flow and its policy): {unlisted}"


def test_every_port_a_process_listens_on_is_a_flow() -> None:
    listening = {name for name in Settings.model_fields if name.endswith("_port")}
    assert listening == {f.port for f in FLOWS if f.port in Settings.model_fields}


def doc_rows() -> list[str]:
    text = (ROOT / "docs" / "operator-guide.md").read_text()
    section = text.split("\n### Network flows\n", 1)[1].split("\n#", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| ")][1:]  # no head


def documented(flow: Flow) -> str:
    """The flow's row in docs/operator-guide.md."""
    port = f"{flow.port}/{flow.protocol}" if flow.port.isdigit() else f"`{flow.port}`"
    opened = ", ".join(f"`{m}`" for m in flow.opened_by) or "-"
    return f"| {flow.name} | {flow.source} | {flow.dest} | {port} | {flow.when} | {opened} |"


def test_the_operator_guide_lists_every_flow() -> None:
    assert doc_rows() == [documented(f) for f in FLOWS]


def test_the_tables_ports_are_the_charts() -> None:
    """The ports the chart opens are the code's: each worker's and the api's named ports are
    the settings the container gets, and those are the code's defaults unless the chart's
    values say otherwise."""
    docs = all_documents(render_chart(VALUES))
    pods = endpoints(docs)
    for endpoint in pods["worker"]:
        assert endpoint.ports["metrics"] == int(endpoint.env["BACKFILL_WORKER_METRICS_PORT"])
        assert endpoint.ports["metrics"] == Settings.model_fields["worker_metrics_port"].default
    [api] = pods["api"]
    assert api.ports["http"] == int(api.env["BACKFILL_API_PORT"])
    assert api.ports["http"] == Settings.model_fields["api_port"].default
    assert api.ports["metrics"] == int(api.env["BACKFILL_API_METRICS_PORT"])
    default = Settings.model_fields["temporal_address"].default
    assert api.env["TEMPORAL_ADDRESS"].rpartition(":")[2] == default.rpartition(":")[2]
