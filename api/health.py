"""`GET /healthz` (200 once Temporal answers) and `GET /metrics` (Prometheus)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from temporalio.api.workflowservice.v1 import GetSystemInfoRequest

from api.deps import ClientDep

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz(client: ClientDep) -> JSONResponse:
    try:
        await client.workflow_service.get_system_info(GetSystemInfoRequest(), timeout=None)
    except Exception as err:
        return JSONResponse({"status": "unavailable", "temporal": str(err)[:200]}, status_code=503)
    return JSONResponse({"status": "ok"})


@router.get("/metrics")
async def metrics() -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
