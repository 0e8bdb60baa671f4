"""`GET /healthz` (which part is degraded) and `GET /metrics` (Prometheus).

`/metrics` names every workspace, model and route with its token counts: on the api port it
answers only platform_admin and auditor keys. For a key-less scrape, the api serves it on a port
of its own (`BACKFILL_API_METRICS_PORT`, loopback unless `BACKFILL_API_METRICS_HOST` says
otherwise; `api.main`).

`/healthz` answers 200 as long as the process serves: the live proxy does not need Temporal, so
an orchestrator must not take a process out of rotation (or restart it) because Temporal is
down. The body says what works: `{"status": "ok" | "degraded", "live_proxy": "ok",
"temporal": "ok" | "unavailable", "temporal_error": ...}`; monitor `status`."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel

from api.deps import IdentityDep
from api.errors import Forbidden
from api.temporal_link import TemporalLink

router = APIRouter(tags=["health"])


class Health(BaseModel):
    status: Literal["ok", "degraded"]
    """`degraded`: the process serves, but a part it depends on is unavailable."""
    live_proxy: Literal["ok"] = "ok"
    """The live proxy depends only on this process and the model servers."""
    temporal: Literal["ok", "unavailable"]
    """Batch endpoints answer 503 `temporal_unavailable` while this is `unavailable`."""
    temporal_error: str | None = None


@router.get("/healthz", response_model=Health, response_model_exclude_none=True)
async def healthz(request: Request) -> Health:
    link: TemporalLink = request.app.state.temporal
    error = await link.check()
    if error is None:
        return Health(status="ok", temporal="ok")
    return Health(status="degraded", temporal="unavailable", temporal_error=error)


@router.get("/metrics")
async def metrics(identity: IdentityDep) -> Response:
    if identity.role not in ("platform_admin", "auditor"):
        raise Forbidden(
            "The metrics show every workspace: only platform_admin and auditor keys may read them.",
            code="insufficient_role",
        )
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
