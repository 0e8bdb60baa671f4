"""`backfill doctor`: check a deployment from its settings and say what to fix.

Each check reads what the processes read (the same settings, the same Temporal namespace, the
same upstreams) and answers one line: `ok` (works, or is off on purpose), `warn` (works, but not
as probably meant) or `fail` (broken; the line after it says how to fix it). Exit 1 when any
check failed. Nothing is changed and no secret is printed.

Checks: Temporal reachable; backfill's search attributes registered on the namespace, with the
exact command for each missing one; each route's upstream answering; each route's server-load
metrics URL approved (as the reader will check it); the preemption channel configured where a
route preempts; the webhook key.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

import httpx
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.api.workflowservice.v1 import GetSystemInfoRequest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from backfill import search_attributes as sa
from backfill.config import Settings, configured_bases
from backfill.gates.preempt import ENTRY as PREEMPT
from backfill.gates.server_load import ENTRY as SERVER_LOAD
from backfill.ids import scheduler_workflow_id
from backfill.load_metrics import approve_metrics_url
from backfill.refs import RouteSchedulerWorkflow
from backfill.temporal_client import connect

Level = Literal["ok", "warn", "fail"]
TIMEOUT_SECONDS = 5.0
"""Bound on each network check."""
MARK = {"ok": "✓", "warn": "!", "fail": "✗"}


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
        resp = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=namespace),
            timeout=timedelta(seconds=TIMEOUT_SECONDS),
        )
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
    registered = {name: _type_name(t) for name, t in resp.custom_attributes.items()}
    return search_attribute_findings(registered, namespace)


async def _route(
    http: httpx.AsyncClient, route_id: str, base_url: str, key_env: str | None
) -> Finding:
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
    return Finding("ok", check, f"{base_url} answers ({resp.status_code} to /models)")


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


def settings_findings(
    settings: Settings, route_id: str, route_settings: Any | None | Exception
) -> list[Finding]:
    """The metrics-URL and preemption checks of one route's durable settings."""
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
        out += _preempt_channel(settings, route_id)
    return out or [Finding("ok", check, "no metrics URL to approve; preemption off")]


def _preempt_channel(settings: Settings, route_id: str) -> list[Finding]:
    check = f"route {route_id} preemption channel"
    if not settings.preempt_token:
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


async def check(settings: Settings) -> list[Finding]:
    """Every finding about the deployment `settings` describes."""
    out: list[Finding] = []
    where = f"{settings.temporal_address} (namespace {settings.temporal_namespace})"
    client: Client | None = None
    try:
        client = await asyncio.wait_for(connect(settings), TIMEOUT_SECONDS)
        await client.workflow_service.get_system_info(
            GetSystemInfoRequest(),
            timeout=timedelta(seconds=TIMEOUT_SECONDS),
        )
        out.append(Finding("ok", "Temporal", f"reachable at {where}"))
    except Exception as err:
        out.append(
            Finding(
                "fail",
                "Temporal",
                f"not reachable at {where} ({type(err).__name__}: {err})",
                "start it, or set TEMPORAL_ADDRESS / TEMPORAL_NAMESPACE (and TLS or "
                "TEMPORAL_API_KEY) to the cluster's",
            )
        )
        client = None
    if client is not None:
        out += await _search_attributes(client, settings.temporal_namespace)
    routes = [(r.id, r.base_url, r.api_key_env) for m in settings.models for r in m.routes]
    async with httpx.AsyncClient(timeout=TIMEOUT_SECONDS, trust_env=False) as http:
        out += await asyncio.gather(*(_route(http, *r) for r in routes))
    if client is not None:
        for route_id, _, _ in routes:
            out += settings_findings(settings, route_id, await _route_settings(client, route_id))
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
