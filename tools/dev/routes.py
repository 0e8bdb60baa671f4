"""Which routes `backfill dev` serves with its simulator, and which must already have a model
server on this machine.

A route on a loopback address at the simulator's port (`--sim-port`, 8100) is the simulator's:
`backfill dev` starts it, serving those routes' models, unless a model server already answers
there (then that server is the route's, as on any other port). A route at another loopback port
names a model server already running (a local vLLM): before anything starts, its port must
answer `GET /models` listing the route's model (`backfill.operations.doctor.route_finding`), or dev
refuses with what to do. Routes to other hosts are left to `backfill doctor`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

from backfill.operations.doctor import TIMEOUT_SECONDS, Finding, route_finding
from backfill.platform.config import Settings
from tools.dev.procs import free_port, port_in_use

LOOPBACK = "127.0.0.1"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class LocalRoute:
    """A route whose upstream is on this machine."""

    model: str
    route_id: str
    base_url: str
    port: int
    api_key_env: str | None


@dataclass(frozen=True)
class Plan:
    """What `backfill dev` does about its routes."""

    sim_models: list[str]
    """The models the simulator serves; empty: the simulator is not started."""
    findings: list[Finding]
    """The checks of the model servers already running (routes not served by the simulator);
    any that is not `ok` refuses the start."""

    @property
    def refused(self) -> list[Finding]:
        return [f for f in self.findings if f.level != "ok"]


def loopback_port(base_url: str) -> int | None:
    """The port of a loopback base URL, None for any other host."""
    parts = urlsplit(base_url)
    if parts.hostname not in LOOPBACK_HOSTS:
        return None
    return parts.port or (443 if parts.scheme == "https" else 80)


def local_routes(settings: Settings) -> list[LocalRoute]:
    return [
        LocalRoute(model.id, route.id, route.base_url, port, route.api_key_env)
        for model in settings.models
        for route in model.routes
        if (port := loopback_port(route.base_url)) is not None
    ]


async def plan(settings: Settings, sim_port: int) -> Plan:
    """The simulator's models, and the checks of every other local route's model server."""
    routes = local_routes(settings)
    at_sim = [r for r in routes if r.port == sim_port]
    # Something already listens on the simulator's port: it is a model server of the user's
    # (checked below like any other), not a port for the simulator.
    sim_free = not port_in_use(sim_port, LOOPBACK)
    sim_models = list(dict.fromkeys(r.model for r in at_sim)) if sim_free else []
    served_elsewhere = [r for r in routes if not (sim_free and r.port == sim_port)]
    async with httpx.AsyncClient(timeout=TIMEOUT_SECONDS, trust_env=False) as http:
        findings = await asyncio.gather(
            *(
                route_finding(http, r.model, r.route_id, r.base_url, r.api_key_env)
                for r in served_elsewhere
            )
        )
    out = [
        _with_hint(f, r, sim_port, sim_free)
        for f, r in zip(findings, served_elsewhere, strict=True)
    ]
    return Plan(sim_models=sim_models, findings=out)


def _with_hint(found: Finding, route: LocalRoute, sim_port: int, sim_free: bool) -> Finding:
    """A refusal, with what `backfill dev` can do about it; anything short of `ok` refuses: a
    local route's port must answer as a model server serving the route's model."""
    if found.level == "ok":
        return found
    fix = found.fix or f"start the model server of route {route.route_id}, or correct its base_url"
    if route.port == sim_port:
        fix += (
            f"\nor, if that server is not yours to use, stop it or move the simulator: run with "
            f'--sim-port N and base_url = "http://{LOOPBACK}:N/v1" for route {route.route_id}, '
            f"N a free port (e.g. {free_port(LOOPBACK)})"
        )
    elif sim_free:
        fix += (
            f"\nor let `backfill dev` serve it with its simulator: "
            f'base_url = "http://{LOOPBACK}:{sim_port}/v1" for route {route.route_id}'
        )
    return Finding("fail", found.check, found.said, fix)
