"""deploy/: the alert rules (promtool), the Grafana dashboard, the compose file, Prometheus'
config and the Helm chart, validated without Docker, a cluster or the network.

promtool comes from Debian's `prometheus` package (`make test` installs it). When it is missing
these tests fail with the install command; they never skip.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
PROMETHEUS = DEPLOY / "prometheus"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "backfill.json"
COMPOSE = DEPLOY / "compose.yml"
CHART = DEPLOY / "helm" / "backfill"

PROMTOOL_INSTALL = "apt-get install -y prometheus"

# The metric names the api and the worker export (issue 11's contract), with their types.
CONTRACT: dict[str, str] = {
    "gateway_batch_route_lines": "gauge",
    "gateway_batch_paused_routes": "gauge",
    "gateway_batch_route_pauses_total": "counter",
    "gateway_batch_line_outcomes_total": "counter",
    "gateway_batch_line_seconds": "histogram",
    "gateway_live_in_flight": "gauge",
    "gateway_live_request_seconds": "histogram",
    "gateway_server_load": "gauge",
    "gateway_server_load_errors_total": "counter",
    "gateway_batch_stall_seconds": "gauge",
}
TEMPORAL_PREFIX = "temporal_"
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")

# PromQL words that are not metric names.
PROMQL_WORDS = {
    # aggregations and their modifiers
    "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile",
    "count_values", "group", "by", "without", "on", "ignoring", "group_left", "group_right",
    "and", "or", "unless", "bool", "offset",
    # functions used or likely in a dashboard
    "rate", "irate", "increase", "delta", "idelta", "deriv", "histogram_quantile", "vector",
    "scalar", "abs", "ceil", "floor", "round", "clamp_min", "clamp_max", "absent",
    "label_replace", "time", "max_over_time", "min_over_time", "avg_over_time", "sort",
    "sort_desc", "inf", "nan",
}  # fmt: skip


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail(
            "promtool is missing: install Debian's prometheus package "
            f"(`{PROMTOOL_INSTALL}`, as root; `make test` does it)",
            pytrace=False,
        )
    return path


def run_promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


# --- alert rules ------------------------------------------------------------------------------


def test_promtool_check_rules() -> None:
    result = run_promtool("check", "rules", "rules.yml", cwd=PROMETHEUS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 7 rules found" in result.stdout


def test_promtool_test_rules() -> None:
    """rules_test.yml: a stalled batch fires BackfillBatchStalled, one waiting legitimately does
    not; every other alert fires only past its threshold and duration."""
    result = run_promtool("test", "rules", "rules_test.yml", cwd=PROMETHEUS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_test_rules_catches_a_wrong_threshold(tmp_path: Path) -> None:
    """The rule tests can fail: with the stall threshold lowered, they do."""
    rules = (PROMETHEUS / "rules.yml").read_text()
    assert "(gateway_batch_stall_seconds) > 1800" in rules
    (tmp_path / "rules.yml").write_text(
        rules.replace("(gateway_batch_stall_seconds) > 1800", "(gateway_batch_stall_seconds) > 600")
    )
    shutil.copy(PROMETHEUS / "rules_test.yml", tmp_path / "rules_test.yml")
    result = run_promtool("test", "rules", "rules_test.yml", cwd=tmp_path)
    assert result.returncode != 0
    assert "BackfillBatchStalled" in result.stdout + result.stderr


def test_rules_cover_the_alerts_the_operator_guide_documents() -> None:
    rules = yaml.safe_load((PROMETHEUS / "rules.yml").read_text())
    alerts = {r["alert"]: r for g in rules["groups"] for r in g["rules"]}
    assert {
        "BackfillBatchStalled",
        "BackfillServerMetricsUnavailable",
        "BackfillWorkersBusy",
        "BackfillWorkerMetricsAbsent",
    } <= set(alerts)
    guide = (ROOT / "docs" / "operator-guide.md").read_text()
    tests = (PROMETHEUS / "rules_test.yml").read_text()
    for name, rule in alerts.items():
        anchor = name.lower()
        assert rule["annotations"]["runbook"] == f"docs/operator-guide.md#{anchor}"
        assert f"### {name}" in guide, f"docs/operator-guide.md has no section for {name}"
        assert f"alertname: {name}" in tests, f"rules_test.yml does not test {name}"


def test_prometheus_config_loads_the_rules_and_scrapes_api_and_workers() -> None:
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    assert config["rule_files"] == ["rules.yml"]
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    api_targets = jobs["backfill-api"]["static_configs"][0]["targets"]
    worker_targets = jobs["backfill-worker"]["static_configs"][0]["targets"]
    assert sorted(api_targets) == ["api-1:9465", "api-2:9465"]  # the key-less metrics port
    assert sorted(worker_targets) == ["worker-1:9464", "worker-2:9464"]
    result = run_promtool("check", "config", "prometheus.yml", cwd=PROMETHEUS)
    assert result.returncode == 0, result.stdout + result.stderr


# --- dashboard --------------------------------------------------------------------------------


def metric_names(expr: str) -> set[str]:
    """The metric names in a PromQL expression (label values, matchers, ranges, groupings and
    numbers removed first)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)  # strings (label values)
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # range selectors
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    words = re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", text)
    return {w for w in words if w.lower() not in PROMQL_WORDS}


def contract_metric(name: str) -> str | None:
    """The contract metric a series name belongs to, or None."""
    if name in CONTRACT:
        return name
    for suffix in HISTOGRAM_SUFFIXES:
        base = name.removesuffix(suffix)
        if base != name and CONTRACT.get(base) == "histogram":
            return base
    return None


def test_metric_names_parser() -> None:
    expr = (
        "histogram_quantile(0.95, sum by (route, phase, le) "
        '(rate(gateway_live_request_seconds_bucket{phase="ttft", x=~"a|b"}[5m]))) '
        "or vector(0) > on(instance) group_left up"
    )
    assert metric_names(expr) == {"gateway_live_request_seconds_bucket", "up"}


def dashboard_panels() -> list[dict[str, Any]]:
    dashboard = json.loads(DASHBOARD.read_text())
    panels: list[dict[str, Any]] = []
    for panel in dashboard["panels"]:
        panels.append(panel)
        panels.extend(panel.get("panels", []))
    return panels


def test_dashboard_queries_name_only_contract_metrics_and_cover_them_all() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "backfill"
    used: set[str] = set()
    temporal: set[str] = set()
    queries = 0
    for panel in dashboard_panels():
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "prometheus", panel["title"]
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        for target in panel["targets"]:
            queries += 1
            for name in metric_names(target["expr"]):
                if name.startswith(TEMPORAL_PREFIX):
                    temporal.add(name)
                    continue
                base = contract_metric(name)
                assert base is not None, f"panel {panel['title']!r}: {name} is not in the contract"
                used.add(base)
    assert queries >= len(CONTRACT)
    assert set(CONTRACT) - used == set(), "contract metrics without a panel"
    assert temporal, "no panel shows the worker's Temporal SDK metrics"


def test_dashboard_panel_ids_and_positions_are_unique() -> None:
    panels = dashboard_panels()
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    cells = set()
    for p in panels:
        pos = p["gridPos"]
        assert 0 <= pos["x"] and pos["x"] + pos["w"] <= 24, p["title"]
        for dx in range(pos["w"]):
            for dy in range(pos["h"]):
                cell = (pos["x"] + dx, pos["y"] + dy)
                assert cell not in cells, f"panel {p['title']!r} overlaps another"
                cells.add(cell)


def test_grafana_provisioning_points_at_prometheus_and_the_dashboard() -> None:
    datasources = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )
    (source,) = datasources["datasources"]
    assert source["uid"] == "prometheus" and source["url"] == "http://prometheus:9090"
    providers = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "dashboards" / "backfill.yml").read_text()
    )
    assert providers["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"


# --- compose ----------------------------------------------------------------------------------


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return loaded


def depends(service: dict[str, Any]) -> dict[str, str]:
    deps = service.get("depends_on", {})
    if isinstance(deps, list):
        return {name: "service_started" for name in deps}
    return {name: spec["condition"] for name, spec in deps.items()}


def test_compose_has_every_service_with_pinned_images() -> None:
    services = compose()["services"]
    assert set(services) >= {
        "postgresql",
        "temporal",
        "temporal-setup",
        "temporal-ui",
        "api-1",
        "api-2",
        "worker-1",
        "worker-2",
        "prometheus",
        "grafana",
    }
    for name, service in services.items():
        image = service["image"]
        if "build" in service:
            assert service["build"]["dockerfile"] == "deploy/Dockerfile", name
            assert (DEPLOY / service["build"]["context"] / "deploy" / "Dockerfile").is_file()
            continue
        tag = image.rpartition(":")[2]
        assert ":" in image and tag not in ("latest", ""), f"{name}: pin {image}"
    assert services["temporal"]["image"].startswith("temporalio/auto-setup:")
    assert services["temporal"]["environment"]["DB"] == "postgres12"
    assert services["temporal-ui"]["image"].startswith("temporalio/ui:")


def test_compose_dependencies_and_commands() -> None:
    services = compose()["services"]
    assert depends(services["temporal"]) == {"postgresql": "service_healthy"}
    setup_script = services["temporal-setup"]["command"][0]
    for attribute in (
        "BackfillWorkspace:Keyword",
        "BackfillStatus:Keyword",
        "BackfillEndpoint:Keyword",
        "BackfillModels:KeywordList",
        "BackfillCreatedAt:Int",
    ):
        assert attribute in setup_script
    for name in ("api-1", "api-2"):
        assert services[name]["command"] == ["api"]
        assert depends(services[name]) == {"temporal-setup": "service_completed_successfully"}
    for name in ("worker-1", "worker-2"):
        assert services[name]["command"] == ["worker"]
        assert depends(services[name])["temporal-setup"] == "service_completed_successfully"
    assert depends(services["grafana"]) == {"prometheus": "service_started"}


def test_compose_apis_and_workers_share_the_file_store_and_config() -> None:
    spec = compose()
    services = spec["services"]
    assert "filestore" in spec["volumes"]
    for name in ("api-1", "api-2", "worker-1", "worker-2"):
        service = services[name]
        assert "filestore:/data" in service["volumes"], name
        assert "./compose/backfill.toml:/etc/backfill/backfill.toml:ro" in service["volumes"]
        env = service["environment"]
        assert env["BACKFILL_DATA_DIR"] == "/data"
        assert env["TEMPORAL_ADDRESS"] == "temporal:7233"
        assert env["BACKFILL_WORKER_METRICS_PORT"] == "9464"
        assert env["BACKFILL_API_METRICS_PORT"] == "9465"  # what prometheus.yml scrapes
    config = (DEPLOY / "compose" / "backfill.toml").read_text()
    assert 'data_dir = "/data"' in config
    assert "fd500b8b04ab347d" not in config, "the shipped dev key must not be exposed"


def test_compose_mounts_prometheus_rules_and_grafana_provisioning() -> None:
    services = compose()["services"]
    prometheus = services["prometheus"]["volumes"]
    assert "./prometheus/rules.yml:/etc/prometheus/rules.yml:ro" in prometheus
    assert "./prometheus/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in prometheus
    grafana = services["grafana"]["volumes"]
    assert "./grafana/provisioning:/etc/grafana/provisioning:ro" in grafana
    assert "./grafana/dashboards:/var/lib/grafana/dashboards:ro" in grafana
    for volume in prometheus + grafana + services["api-1"]["volumes"]:
        source = volume.split(":")[0]
        if source.startswith("./"):
            assert (DEPLOY / source).exists(), f"compose mounts missing {source}"


# --- Dockerfile -------------------------------------------------------------------------------


def test_dockerfile_installs_the_project_as_a_non_root_user() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim", text, re.M)
    assert "RUN pip install ." in text
    assert re.search(r"^USER 10001", text, re.M)
    assert 'ENTRYPOINT ["backfill"]' in text
    packages = {line.split()[1] for line in text.splitlines() if line.startswith("COPY ")}
    pyproject = (ROOT / "pyproject.toml").read_text()
    include = re.search(r"include = \[([^\]]*)\]", pyproject)
    assert include is not None
    for package in re.findall(r'"(\w+)\*"', include.group(1)):
        assert package in packages, f"the Dockerfile does not copy the {package} package"


# --- Helm chart -------------------------------------------------------------------------------


def render_chart(values: dict[str, Any] | None = None) -> dict[str, list[dict[str, Any]]]:
    """`helm template` through Helm's own Go SDK (helm-python-sdk): template name -> documents."""
    from helm_python import Chart

    with Chart.load(CHART) as chart:
        rendered = chart.render(values=values or {}, name="backfill", namespace="batch")
    out: dict[str, list[dict[str, Any]]] = {}
    for name, text in rendered.items():
        if name.endswith("NOTES.txt"):
            continue
        out[name.rpartition("/")[2]] = [d for d in yaml.safe_load_all(text) if d]
    return out


def all_documents(rendered: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return [doc for docs in rendered.values() for doc in docs]


def test_chart_metadata_and_values_parse() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "backfill"
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["api"]["replicas"] == 2 and values["worker"]["replicas"] == 2
    assert values["fileStore"]["pvc"]["accessModes"] == ["ReadWriteMany"]


def test_every_value_the_templates_use_is_in_values_yaml() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for template in (CHART / "templates").iterdir():
        for path in re.findall(r"\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)", template.read_text()):
            node: Any = values
            for key in path.strip(".").split("."):
                assert isinstance(node, dict) and key in node, f"{template.name}: .Values{path}"
                node = node[key]


def test_chart_renders_api_and_workers_against_existing_temporal() -> None:
    rendered = render_chart(
        {
            "temporal": {
                "address": "temporal.example:7233",
                "namespace": "batch-prod",
                "tls": {"enabled": True, "clientCertSecret": "temporal-client"},
                "apiKey": {"existingSecret": "temporal-key", "key": "key"},
            },
            "api": {"replicas": 3},
            "worker": {"replicas": 5, "maxConcurrentActivities": 64},
            "upstreamKeys": {"existingSecret": "model-keys"},
        }
    )
    docs = {(d["kind"], d["metadata"]["name"]): d for d in all_documents(rendered)}
    api = docs[("Deployment", "backfill-api")]
    worker = docs[("Deployment", "backfill-worker")]
    assert api["spec"]["replicas"] == 3 and worker["spec"]["replicas"] == 5
    for deployment, command in ((api, "api"), (worker, "worker")):
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert container["args"] == [command]
        env = {e["name"]: e for e in container["env"]}
        assert env["TEMPORAL_ADDRESS"]["value"] == "temporal.example:7233"
        assert env["TEMPORAL_NAMESPACE"]["value"] == "batch-prod"
        assert env["TEMPORAL_TLS"]["value"] == "true"
        assert env["TEMPORAL_TLS_CERT"]["value"] == "/etc/temporal-tls/tls.crt"
        assert env["TEMPORAL_API_KEY"]["valueFrom"]["secretKeyRef"] == {
            "name": "temporal-key",
            "key": "key",
        }
        assert container["envFrom"] == [{"secretRef": {"name": "model-keys"}}]
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert mounts["/data"] == "files" and mounts["/etc/backfill"] == "config"
        volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
        assert volumes["files"]["persistentVolumeClaim"]["claimName"] == "backfill-files"
        assert volumes["config"]["configMap"]["name"] == "backfill-config"
    worker_env = {
        e["name"]: e.get("value")
        for e in worker["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert worker_env["BACKFILL_WORKER_MAX_CONCURRENT_ACTIVITIES"] == "64"
    assert worker_env["BACKFILL_WORKER_METRICS_PORT"] == "9464"
    # The api's key-less /metrics: its own port, on the pod's IP; the Service carries it.
    (api_container,) = api["spec"]["template"]["spec"]["containers"]
    api_env = {e["name"]: e for e in api_container["env"]}
    assert api_env["BACKFILL_API_METRICS_PORT"]["value"] == "9465"
    assert api_env["BACKFILL_API_METRICS_HOST"]["valueFrom"]["fieldRef"] == {
        "fieldPath": "status.podIP"
    }
    assert {p["name"]: p["containerPort"] for p in api_container["ports"]} == {
        "http": 8000,
        "metrics": 9465,
    }
    api_service = docs[("Service", "backfill-api")]
    assert {p["name"] for p in api_service["spec"]["ports"]} == {"http", "metrics"}
    pvc = docs[("PersistentVolumeClaim", "backfill-files")]
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    config = docs[("ConfigMap", "backfill-config")]
    assert "[[models.routes]]" in config["data"]["backfill.toml"]


def test_chart_existing_claim_and_optional_objects() -> None:
    plain = all_documents(render_chart({"fileStore": {"pvc": {"existingClaim": "shared"}}}))
    kinds = {d["kind"] for d in plain}
    assert "PersistentVolumeClaim" not in kinds
    assert "ServiceMonitor" not in kinds and "Job" not in kinds
    full = all_documents(
        render_chart(
            {
                "metrics": {"serviceMonitor": {"enabled": True}},
                "temporal": {"registerSearchAttributes": {"enabled": True}},
            }
        )
    )
    (monitor,) = [d for d in full if d["kind"] == "ServiceMonitor"]
    assert monitor["spec"]["jobLabel"] == "backfill.io/scrape-job"
    # Only the key-less metrics ports: the api's http port answers /metrics to keys only.
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
    jobs = {
        d["metadata"]["labels"].get("backfill.io/scrape-job")
        for d in full
        if d["kind"] == "Service"
    }
    assert jobs == {"backfill-api", "backfill-worker"}
    (job,) = [d for d in full if d["kind"] == "Job"]
    script = job["spec"]["template"]["spec"]["containers"][0]["args"][0]
    assert "BackfillModels:KeywordList" in script


S3_VALUES: dict[str, Any] = {
    "fileStore": {
        "type": "s3",
        "s3": {
            "bucket": "batch-files",
            "prefix": "prod/",
            "endpoint": "https://minio.internal:9000",
            "region": "eu-west-1",
            "partBytes": 16 * 1024 * 1024,
            "credentialsSecret": "s3-keys",
        },
    },
    "upstreamKeys": {"existingSecret": "model-keys"},
}
SPLIT_VALUES: dict[str, Any] = {
    "worker": {
        "split": {
            "enabled": True,
            "workflows": {"replicas": 1, "resources": {"requests": {"cpu": "100m"}}},
            "activities": {"replicas": 4, "resources": {"requests": {"cpu": "2"}}},
        }
    },
    "upstreamKeys": {"existingSecret": "model-keys"},
}


def by_kind_and_name(values: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in all_documents(render_chart(values))}


def pod_parts(deployment: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(container, env by name, volumes by name) of a one-container Deployment."""
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e for e in container["env"]}
    return container, env, {v["name"]: v for v in pod["volumes"]}


def data_volume(deployment: dict[str, Any]) -> dict[str, Any] | None:
    """The volume mounted at /data (BACKFILL_DATA_DIR), or None."""
    container, _, volumes = pod_parts(deployment)
    names = [m["name"] for m in container["volumeMounts"] if m["mountPath"] == "/data"]
    return volumes[names[0]] if names else None


def test_chart_s3_store_passes_settings_as_env_and_credentials_from_the_secret() -> None:
    docs = by_kind_and_name(S3_VALUES)
    assert not [key for key in docs if key[0] == "PersistentVolumeClaim"]
    for name in ("backfill-api", "backfill-worker"):
        _, env, _ = pod_parts(docs[("Deployment", name)])
        values = {n: e.get("value") for n, e in env.items()}
        assert values["BACKFILL_STORE"] == "s3", name
        assert values["BACKFILL_S3_BUCKET"] == "batch-files"
        assert values["BACKFILL_S3_PREFIX"] == "prod/"
        assert values["BACKFILL_S3_ENDPOINT_URL"] == "https://minio.internal:9000"
        assert values["BACKFILL_S3_REGION"] == "eu-west-1"
        assert values["BACKFILL_S3_PART_BYTES"] == "16777216"
        assert values["BACKFILL_DATA_DIR"] == "/data"
        for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
            assert "value" not in env[var], f"{name}: {var} in clear"
            ref = env[var]["valueFrom"]["secretKeyRef"]
            assert (ref["name"], ref["key"]) == ("s3-keys", var)
            assert ref.get("optional", False) == (var == "AWS_SESSION_TOKEN")
        # The store's volume is gone; /data keeps only the usage journal, on an emptyDir.
        assert data_volume(docs[("Deployment", name)]) == {"name": "usage", "emptyDir": {}}
    # Nothing about the store or its credentials lands in the ConfigMap; the Temporal setup
    # Job (no store) gets none of it either.
    assert "AWS_" not in json.dumps(docs[("ConfigMap", "backfill-config")])


def test_chart_s3_store_optional_settings_and_a_shared_usage_journal() -> None:
    docs = by_kind_and_name(
        {
            "fileStore": {
                "type": "s3",
                "s3": {"bucket": "b", "usageJournalClaim": "usage-rwx"},
                "pvc": {"existingClaim": "ignored-in-s3-mode"},
            },
            "serviceAccountName": "backfill-irsa",
            "temporal": {"registerSearchAttributes": {"enabled": True}},
        }
    )
    assert not [key for key in docs if key[0] == "PersistentVolumeClaim"]
    for name in ("backfill-api", "backfill-worker"):
        deployment = docs[("Deployment", name)]
        _, env, volumes = pod_parts(deployment)
        assert env["BACKFILL_STORE"]["value"] == "s3" and env["BACKFILL_S3_BUCKET"]["value"] == "b"
        unset = {
            n for n in env if n.startswith(("AWS_", "BACKFILL_S3_")) and n != "BACKFILL_S3_BUCKET"
        }
        assert unset == set(), f"{name}: empty values must not become variables"
        assert data_volume(deployment) == {
            "name": "usage",
            "persistentVolumeClaim": {"claimName": "usage-rwx"},
        }
        assert "ignored-in-s3-mode" not in json.dumps(volumes)
        assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "backfill-irsa"
    (job,) = [d for key, d in docs.items() if key[0] == "Job"]
    job_env = {e["name"] for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert "BACKFILL_STORE" not in job_env


def test_chart_s3_store_without_a_bucket_fails_with_a_clear_message() -> None:
    from helm_python import HelmError

    with pytest.raises(HelmError, match=r"fileStore\.s3\.bucket is required"):
        render_chart({"fileStore": {"type": "s3"}})
    with pytest.raises(HelmError, match='fileStore.type "gcs" is unknown'):
        render_chart({"fileStore": {"type": "gcs"}})


def test_chart_default_runs_one_worker_of_every_role() -> None:
    docs = by_kind_and_name({})
    workers = [key for key in docs if key[0] == "Deployment" and "worker" in key[1]]
    assert workers == [("Deployment", "backfill-worker")]
    worker = docs[("Deployment", "backfill-worker")]
    _, env, _ = pod_parts(worker)
    assert "BACKFILL_WORKER_ROLE" not in env and "BACKFILL_STORE" not in env
    assert env["BACKFILL_WORKER_EAGER_ACTIVITIES"]["value"] == "256"
    assert "backfill.io/worker-role" not in worker["spec"]["selector"]["matchLabels"]
    assert data_volume(worker) == {
        "name": "files",
        "persistentVolumeClaim": {"claimName": "backfill-files"},
    }


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_chart_split_workers_render_two_roles_both_scraped() -> None:
    docs = by_kind_and_name({**SPLIT_VALUES, "metrics": {"serviceMonitor": {"enabled": True}}})
    assert ("Deployment", "backfill-worker") not in docs
    workflows = docs[("Deployment", "backfill-worker-workflows")]
    activities = docs[("Deployment", "backfill-worker-activities")]
    assert workflows["spec"]["replicas"] == 1 and activities["spec"]["replicas"] == 4
    service = docs[("Service", "backfill-worker-metrics")]
    assert service["metadata"]["labels"]["backfill.io/scrape-job"] == "backfill-worker"
    (monitor,) = [d for key, d in docs.items() if key[0] == "ServiceMonitor"]
    assert selects(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    for deployment, role, cpu in (
        (workflows, "workflows", "100m"),
        (activities, "activities", "2"),
    ):
        container, env, _ = pod_parts(deployment)
        assert env["BACKFILL_WORKER_ROLE"]["value"] == role
        assert env["BACKFILL_WORKER_EAGER_ACTIVITIES"]["value"] == "0"
        assert container["resources"]["requests"]["cpu"] == cpu
        assert {p["name"] for p in container["ports"]} == {"metrics"}
        pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
        selector = deployment["spec"]["selector"]["matchLabels"]
        assert selects(selector, pod_labels) and selector["backfill.io/worker-role"] == role
        assert selects(service["spec"]["selector"], pod_labels), f"{role} workers not scraped"
    # Each Deployment's selector leaves the other's pods alone.
    for mine, other in ((workflows, activities), (activities, workflows)):
        other_labels = other["spec"]["template"]["metadata"]["labels"]
        assert not selects(mine["spec"]["selector"]["matchLabels"], other_labels)
    # A workflows-only worker opens no store, journal or upstream client: no /data, no keys.
    container, env, _ = pod_parts(workflows)
    assert data_volume(workflows) is None
    assert "envFrom" not in container and "BACKFILL_WORKER_MAX_CONCURRENT_ACTIVITIES" not in env
    container, env, _ = pod_parts(activities)
    assert data_volume(activities) == {
        "name": "files",
        "persistentVolumeClaim": {"claimName": "backfill-files"},
    }
    assert container["envFrom"] == [{"secretRef": {"name": "model-keys"}}]
    assert env["BACKFILL_WORKER_MAX_CONCURRENT_ACTIVITIES"]["value"] == "512"


def test_chart_split_workers_on_s3_keep_credentials_from_the_workflows_worker() -> None:
    docs = by_kind_and_name({**S3_VALUES, **SPLIT_VALUES})
    _, env, _ = pod_parts(docs[("Deployment", "backfill-worker-workflows")])
    assert not {n for n in env if n.startswith(("AWS_", "BACKFILL_S3_", "BACKFILL_STORE"))}
    assert data_volume(docs[("Deployment", "backfill-worker-workflows")]) is None
    activities = docs[("Deployment", "backfill-worker-activities")]
    _, env, _ = pod_parts(activities)
    assert env["BACKFILL_STORE"]["value"] == "s3"
    assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "s3-keys"
    assert data_volume(activities) == {"name": "usage", "emptyDir": {}}


def test_chart_env_is_what_backfill_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rendered variables, loaded by backfill's own settings (with the chart's backfill.toml),
    give the S3 store and the roles: no name in the chart is misspelt."""
    from backfill.platform.config import Settings, load_settings

    docs = by_kind_and_name({**S3_VALUES, **SPLIT_VALUES})
    (tmp_path / "backfill.toml").write_text(
        docs[("ConfigMap", "backfill-config")]["data"]["backfill.toml"]
    )
    loaded: dict[str, Settings] = {}
    for name in ("backfill-api", "backfill-worker-workflows", "backfill-worker-activities"):
        with monkeypatch.context() as env:
            for var in list(os.environ):
                if var.startswith(("BACKFILL_", "TEMPORAL_", "AWS_")):
                    env.delenv(var)
            for var, entry in pod_parts(docs[("Deployment", name)])[1].items():
                if "value" in entry:
                    env.setenv(var, entry["value"])
            env.setenv("BACKFILL_CONFIG", str(tmp_path / "backfill.toml"))
            loaded[name] = load_settings()
    for name in ("backfill-api", "backfill-worker-activities"):
        settings = loaded[name]
        assert settings.store == "s3" and settings.s3_bucket == "batch-files", name
        assert settings.s3_prefix == "prod/" and settings.s3_region == "eu-west-1"
        assert settings.s3_endpoint_url == "https://minio.internal:9000"
        assert settings.s3_part_bytes == 16 * 1024 * 1024
        assert str(settings.data_dir) == "/data"
    assert loaded["backfill-worker-activities"].worker_role == "activities"
    workflows = loaded["backfill-worker-workflows"]
    assert workflows.worker_role == "workflows" and workflows.store == "local"
    assert workflows.worker_eager_activities == 0


@pytest.mark.parametrize(
    "values",
    [
        {},
        {
            "temporal": {
                "tls": {"enabled": True, "clientCertSecret": "c"},
                "apiKey": {"existingSecret": "k"},
                "registerSearchAttributes": {"enabled": True},
            },
            "upstreamKeys": {"existingSecret": "u"},
            "api": {"nodeSelector": {"pool": "api"}, "extraEnv": [{"name": "X", "value": "1"}]},
        },
        S3_VALUES,
        {**S3_VALUES, "fileStore": {"type": "s3", "s3": {"bucket": "b", "usageJournalClaim": "u"}}},
        SPLIT_VALUES,
        {**S3_VALUES, **SPLIT_VALUES, "serviceAccountName": "backfill"},
    ],
    ids=["defaults", "everything-on", "s3", "s3-usage-claim", "split", "s3-split"],
)
def test_chart_manifests_match_the_kubernetes_schemas(values: dict[str, Any]) -> None:
    """Every rendered object validates (strictly: no unknown fields) against the Kubernetes
    JSON schemas bundled in kubernetes-validate."""
    import kubernetes_validate

    version = kubernetes_validate.latest_version()
    documents = all_documents(render_chart(values))
    assert len(documents) >= 5  # api, worker, their services, the ConfigMap
    for doc in documents:
        kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("values", [{}, SPLIT_VALUES], ids=["default", "split"])
def test_chart_pods_are_locked_down_by_default(values: dict[str, Any]) -> None:
    """No service-account token, the runtime's seccomp profile, metrics on the pod's IP only,
    and NetworkPolicies: the workers take nothing but scrapes, and every pod talks only to
    DNS, Temporal and the model servers."""
    docs = by_kind_and_name(values)
    deployments = [d for (kind, _), d in docs.items() if kind == "Deployment"]
    assert len(deployments) == (3 if values else 2)
    policies = {name: d for (kind, name), d in docs.items() if kind == "NetworkPolicy"}
    assert set(policies) == {"backfill-api", "backfill-worker"}
    for deployment in deployments:
        pod = deployment["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        _, env, _ = pod_parts(deployment)
        for name in ("BACKFILL_WORKER_METRICS_HOST", "BACKFILL_API_METRICS_HOST"):
            if name in env:
                assert env[name] == {
                    "name": name,
                    "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
                }
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        component = labels["app.kubernetes.io/component"]
        (policy,) = [
            p for p in policies.values() if selects(p["spec"]["podSelector"]["matchLabels"], labels)
        ]
        assert policy["metadata"]["name"] == f"backfill-{component}"
        spec = policy["spec"]
        assert spec["policyTypes"] == ["Ingress", "Egress"]
        ingress_ports = [port["port"] for rule in spec["ingress"] for port in rule["ports"]]
        assert ingress_ports == (["http", "metrics"] if component == "api" else ["metrics"])
        egress = spec["egress"]
        assert [p["port"] for p in egress[0]["ports"]] == [53, 53]  # DNS
        assert egress[1]["ports"] == [{"port": 7233, "protocol": "TCP"}]  # Temporal
        assert egress[1]["to"] == [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "temporal"}}}
        ]
        assert egress[2] == {"to": [{"namespaceSelector": {}}]}  # model servers, in-cluster
        assert len(egress) == 3
    # Off when asked (e.g. a CNI without NetworkPolicy), and more egress when asked.
    off = by_kind_and_name({"networkPolicy": {"enabled": False}})
    assert not [k for k in off if k[0] == "NetworkPolicy"]
    s3 = {"to": [{"ipBlock": {"cidr": "203.0.113.10/32"}}], "ports": [{"port": 443}]}
    extra = by_kind_and_name({"networkPolicy": {"egress": {"extra": [s3]}}})
    assert s3 in extra[("NetworkPolicy", "backfill-worker")]["spec"]["egress"]
