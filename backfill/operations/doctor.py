"""`backfill doctor`: check a deployment from its settings and say what to fix.

Each check reads what the processes read (the same settings, the same Temporal namespace, the
same upstreams) and answers one line: `ok` (works, or is off on purpose), `warn` (works, but not
as probably meant) or `fail` (broken; the line after it says how to fix it). Exit 1 when any
check failed. Nothing is changed and no secret is printed.

Checks: Temporal reachable and its namespace there; backfill's search attributes registered on
the namespace, with the exact command for each missing one; a worker polling the task queue;
each route's upstream answering as a model server that serves the route's model; each route's
server-load metrics URL approved (as the reader will check it); the preemption channel
configured where a route preempts; the webhook key.

Where `backfill dev` runs from the same data directory and TEMPORAL_ADDRESS is not set, the
doctor checks that stack (its Temporal, namespace and task queue, from
`backfill.operations.dev_stack`), whatever ports it was moved to.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

import httpx
from temporalio.api.enums.v1 import IndexedValueType, TaskQueueType
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import (
    DescribeNamespaceRequest,
    DescribeTaskQueueRequest,
    GetSystemInfoRequest,
)
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from backfill.batches import search_attributes as sa
from backfill.operations import dev_stack
from backfill.platform.config import Settings, configured_bases
from backfill.platform.ids import scheduler_workflow_id
from backfill.platform.refs import RouteSchedulerWorkflow
from backfill.platform.temporal_client import connect
from backfill.routes.gates.preempt import ENTRY as PREEMPT
from backfill.routes.gates.server_load import ENTRY as SERVER_LOAD
from backfill.upstream.load_metrics import approve_metrics_url

Level = Literal["ok", "warn", "fail"]
TIMEOUT_SECONDS = 5.0
"""Bound on each network check."""
MARK = {"ok": "✓", "warn": "!", "fail": "✗"}
MAX_MODELS_SHOWN = 5
"""How many of a server's model ids a finding names when the route's model is not among them."""


@dataclass(frozen=True)
class Finding:
    level: Level
    check: str
    said: str
    fix: str = ""

    def lines(self) -> list[str]:
        out = [f"{MARK[self.level]} {self.check}: {self.said}"]
        if self.fix:
            out += [f"    fix: {line}" for line in self.fix.splitlines()]
        return out


def _type_name(value: int) -> str:
    """`IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD_LIST` → `KeywordList`."""
    name = IndexedValueType.Name(value).removeprefix("INDEXED_VALUE_TYPE_")  # type: ignore[arg-type]
    return "".join(part.capitalize() for part in name.split("_"))


def search_attribute_findings(registered: dict[str, str], namespace: str) -> list[Finding]:
    """Each of backfill's search attributes against `registered` (name → type)."""
    out: list[Finding] = []
    for name, wanted in sa.ALL.items():
        have = registered.get(name)
        if have == wanted:
            continue
        command = (
            f"temporal operator search-attribute create --namespace {namespace} "
            f"--name {name} --type {wanted}"
        )
        if have is None:
            out.append(
                Finding(
                    "fail", "search attributes", f"{name} ({wanted}) is not registered", command
                )
            )
        else:
            out.append(
                Finding(
                    "fail",
                    "search attributes",
                    f"{name} is registered as {have}, not {wanted}",
                    f"remove it (temporal operator search-attribute remove --namespace "
                    f"{namespace} --name {name}), then: {command}",
                )
            )
    if not out:
        out.append(
            Finding("ok", "search attributes", f"all {len(sa.ALL)} registered on {namespace}")
        )
    return out


async def _search_attributes(client: Client, namespace: str) -> list[Finding]:
    try:
        registered = await registered_search_attributes(client, namespace)
    except RPCError as err:
        return [
            Finding(
                "warn",
                "search attributes",
                f"cannot list them ({err.status.name}: {err.message})",
                "check them by hand: temporal operator search-attribute list --namespace "
                f"{namespace} | grep Backfill",
            )
        ]
    return search_attribute_findings(registered, namespace)


async def route_finding(
    http: httpx.AsyncClient, model_id: str, route_id: str, base_url: str, key_env: str | None
) -> Finding:
    """The route's upstream answers `GET /models` as a model server and lists `model_id`."""
    check = f"route {route_id}"
    headers = {}
    if key_env:
        key = os.environ.get(key_env, "")
        if not key:
            return Finding(
                "fail",
                check,
                f"its api_key_env {key_env} is not set in this environment",
                f"set {key_env} where the worker and api run (and here)",
            )
        headers["Authorization"] = f"Bearer {key}"
    url = base_url.rstrip("/") + "/models"
    try:
        resp = await http.get(url, headers=headers)
    except httpx.HTTPError as err:
        return Finding(
            "fail",
            check,
            f"{url} does not answer ({type(err).__name__}: {err})",
            f"start the model server, or correct base_url of route {route_id} in the config",
        )
    if resp.status_code in (401, 403):
        return Finding(
            "fail",
            check,
            f"{url} refused the key ({resp.status_code})",
            f"check the key in {key_env}" if key_env else "set api_key_env for this route",
        )
    if resp.status_code >= 500:
        return Finding("warn", check, f"{url} answered {resp.status_code}")
    served = served_models(resp)
    if served is None:
        return Finding(
            "warn",
            check,
            f"{url} answered {resp.status_code} without a model list: cannot tell whether it "
            f"serves {model_id}",
        )
    if model_id not in served:
        shown = ", ".join(served[:MAX_MODELS_SHOWN]) + (
            ", ..." if len(served) > MAX_MODELS_SHOWN else ""
        )
        return Finding(
            "fail",
            check,
            f"{base_url} does not serve model {model_id} (it serves: {shown or 'nothing'}): "
            "every line would be refused",
            f"serve it under that name (vLLM: --served-model-name {model_id}), or name the "
            "model in the config as the server does",
        )
    return Finding("ok", check, f"{base_url} serves {model_id}")


def served_models(resp: httpx.Response) -> list[str] | None:
    """The model ids of an OpenAI-style `GET /models` answer, None when it is not one."""
    if resp.status_code != 200:
        return None
    try:
        data = resp.json().get("data")
    except (ValueError, AttributeError):
        return None
    if not isinstance(data, list):
        return None
    return [str(m["id"]) for m in data if isinstance(m, dict) and "id" in m]


async def _route_settings(client: Client, route_id: str) -> Any | None | Exception:
    """The scheduler's settings, None when it has not started yet, the error when it did not
    answer."""
    handle = client.get_workflow_handle_for(
        RouteSchedulerWorkflow.run, scheduler_workflow_id(route_id)
    )
    try:
        status = await asyncio.wait_for(
            handle.query(
                RouteSchedulerWorkflow.status,
                time.time(),
                rpc_timeout=timedelta(seconds=TIMEOUT_SECONDS),
            ),
            TIMEOUT_SECONDS + 1,
        )
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return None
        return err
    except Exception as err:  # a timeout, a query failed in the worker
        return err
    return status.settings


async def _namespace_exists(client: Client, namespace: str) -> bool:
    try:
        await client.workflow_service.describe_namespace(
            DescribeNamespaceRequest(namespace=namespace),
            timeout=timedelta(seconds=TIMEOUT_SECONDS),
        )
    except RPCError as err:
        return err.status != RPCStatusCode.NOT_FOUND
    return True


def settings_findings(
    settings: Settings,
    route_id: str,
    route_settings: Any | None | Exception,
    *,
    preempt_token: bool | None = None,
) -> list[Finding]:
    """The metrics-URL and preemption checks of one route's durable settings; preempt_token:
    whether the processes have a preemption token (None: whether the settings name one)."""
    check = f"route {route_id} settings"
    if route_settings is None:
        return [Finding("ok", check, "no scheduler yet: the config's values apply at first use")]
    if isinstance(route_settings, Exception):
        return [
            Finding(
                "warn",
                check,
                f"its scheduler did not answer ({type(route_settings).__name__}): is a worker "
                "running?",
            )
        ]
    out: list[Finding] = []
    load = SERVER_LOAD.setting(route_settings)
    url = getattr(load, "metrics_url", None) if load is not None else None
    if url:
        try:
            approve_metrics_url(url, configured_bases(settings))
            out.append(Finding("ok", f"route {route_id} metrics URL", f"{url} is approved"))
        except ValueError as err:
            out.append(
                Finding(
                    "fail",
                    f"route {route_id} metrics URL",
                    str(err),
                    "PUT the route's settings with one of those URLs, or add the server's "
                    "base URL (with /v1) to GATEWAY_LOCAL_UPSTREAMS",
                )
            )
    if PREEMPT.setting(route_settings) is not None:
        if preempt_token is None:
            preempt_token = bool(settings.preempt_token)
        out += _preempt_channel(preempt_token, route_id)
    return out or [Finding("ok", check, "no metrics URL to approve; preemption off")]


def _preempt_channel(token_set: bool, route_id: str) -> list[Finding]:
    check = f"route {route_id} preemption channel"
    if not token_set:
        return [
            Finding(
                "fail",
                check,
                "the route preempts but BACKFILL_PREEMPT_TOKEN is not set: no line is ever "
                "preempted",
                "set the same BACKFILL_PREEMPT_TOKEN on every api process and worker "
                "(docs/decisions/0023)",
            )
        ]
    return [Finding("ok", check, "BACKFILL_PREEMPT_TOKEN is set")]


def webhook_finding(settings: Settings) -> Finding:
    if settings.webhook_key:
        return Finding("ok", "webhook key", "set (endpoints made through the api are signed)")
    if settings.webhooks:
        return Finding("ok", "webhook key", "not set: only the [[webhooks]] of the config are used")
    return Finding(
        "ok",
        "webhook key",
        "not set: webhooks are off (set BACKFILL_WEBHOOK_KEY to let workspaces add endpoints)",
    )


async def _pollers(client: Client, namespace: str, task_queue: str) -> Finding:
    """A worker polls the task queue for workflow tasks and for activity tasks."""
    counts: dict[str, int] = {}
    for name, kind in (
        ("workflow", TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW),
        ("activity", TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY),
    ):
        try:
            resp = await client.workflow_service.describe_task_queue(
                DescribeTaskQueueRequest(
                    namespace=namespace,
                    task_queue=TaskQueue(name=task_queue),
                    task_queue_type=kind,
                ),
                timeout=timedelta(seconds=TIMEOUT_SECONDS),
            )
        except RPCError as err:
            return Finding(
                "warn", "worker", f"cannot describe task queue {task_queue} ({err.message})"
            )
        counts[name] = len(resp.pollers)
    if not all(counts.values()):
        missing = " and ".join(f"{k} tasks" for k, n in counts.items() if not n)
        return Finding(
            "fail",
            "worker",
            f"no worker polls task queue {task_queue} for {missing}: batches wait",
            f"start `backfill worker` with the same TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE and "
            f"BACKFILL_TASK_QUEUE ({task_queue})",
        )
    return Finding(
        "ok",
        "worker",
        f"task queue {task_queue} is polled ({counts['workflow']} workflow and "
        f"{counts['activity']} activity poller(s))",
    )


def follow_dev_stack(settings: Settings) -> tuple[Settings, dev_stack.DevStack | None]:
    """The settings of the `backfill dev` running from this data directory, when the
    environment names no Temporal of its own."""
    if "temporal_address" in settings.model_fields_set:
        return settings, None
    stack = dev_stack.running(settings.data_dir)
    if stack is None:
        return settings, None
    update = {
        "temporal_address": stack.temporal_address,
        "temporal_namespace": stack.temporal_namespace,
        "task_queue": stack.task_queue,
    }
    return settings.model_copy(update=update), stack


async def temporal(settings: Settings, where: str = "") -> tuple[Client | None, Finding]:
    """A client of the settings' Temporal and namespace, or None with the finding that says why."""
    where = where or f"{settings.temporal_address} (namespace {settings.temporal_namespace})"
    try:
        client = await asyncio.wait_for(connect(settings), TIMEOUT_SECONDS)
        await client.workflow_service.get_system_info(
            GetSystemInfoRequest(),
            timeout=timedelta(seconds=TIMEOUT_SECONDS),
        )
    except Exception as err:
        return None, Finding(
            "fail",
            "Temporal",
            f"not reachable at {where} ({type(err).__name__}: {err})",
            "start it, or set TEMPORAL_ADDRESS / TEMPORAL_NAMESPACE (and TLS or "
            "TEMPORAL_API_KEY) to the cluster's",
        )
    if not await _namespace_exists(client, settings.temporal_namespace):
        return None, Finding(
            "fail",
            "Temporal",
            f"namespace {settings.temporal_namespace} does not exist at "
            f"{settings.temporal_address}",
            f"temporal operator namespace create --namespace {settings.temporal_namespace} "
            "(or set TEMPORAL_NAMESPACE to an existing one)",
        )
    return client, Finding("ok", "Temporal", f"reachable at {where}")


async def registered_search_attributes(client: Client, namespace: str) -> dict[str, str]:
    """The namespace's custom search attributes, name → type (`Keyword`, ...)."""
    resp = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=namespace),
        timeout=timedelta(seconds=TIMEOUT_SECONDS),
    )
    return {name: _type_name(t) for name, t in resp.custom_attributes.items()}


async def check(settings: Settings) -> list[Finding]:
    """Every finding about the deployment `settings` describes."""
    settings, dev = follow_dev_stack(settings)
    where = f"{settings.temporal_address} (namespace {settings.temporal_namespace})"
    if dev is not None:
        where += f": the `backfill dev` running from {settings.data_dir} (pid {dev.pid})"
    client, reached = await temporal(settings, where)
    out = [reached]
    if client is not None:
        out += await _search_attributes(client, settings.temporal_namespace)
        out.append(await _pollers(client, settings.temporal_namespace, settings.task_queue))
    routes = [(m.id, r.id, r.base_url, r.api_key_env) for m in settings.models for r in m.routes]
    async with httpx.AsyncClient(timeout=TIMEOUT_SECONDS, trust_env=False) as http:
        out += await asyncio.gather(*(route_finding(http, *r) for r in routes))
    if client is not None:
        preempt_token = bool(settings.preempt_token) or (dev is not None and dev.preempt_token_set)
        for _, route_id, _, _ in routes:
            found = await _route_settings(client, route_id)
            out += settings_findings(settings, route_id, found, preempt_token=preempt_token)
    out.append(webhook_finding(settings))
    return out


def report(findings: list[Finding]) -> tuple[str, int]:
    """The text to print and the exit code."""
    lines = [line for f in findings for line in f.lines()]
    failed = sum(f.level == "fail" for f in findings)
    warned = sum(f.level == "warn" for f in findings)
    if failed:
        lines.append(f"{failed} problem(s) to fix" + (f", {warned} warning(s)" if warned else ""))
    elif warned:
        lines.append(f"All checks passed, {warned} warning(s)")
    else:
        lines.append("All checks passed")
    return "\n".join(lines), 1 if failed else 0


def run(settings: Settings) -> int:
    text, code = report(asyncio.run(check(settings)))
    print(text, flush=True)
    return code
