"""Routes: each route's "Batch scheduling" (status, chart, settings), and the settings' Edit form.

Reads are `GET /api/v1/platform/deployments/{id}/batch-scheduling`'s function (403 for members),
saving is the PUT's (platform admins only): the form becomes the same `RouteSettings` document
the JSON API validates, and the errors of that validation are shown next to their fields. Each
gate's fieldset and read-only row come from its registry entry (`backfill.routes.gates.registry`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import Request
from fastapi.responses import RedirectResponse, Response
from pydantic import ValidationError
from starlette.datastructures import FormData

from api.console.charts import route_chart
from api.console.web import SessionDep, checked_form, render, router, state
from api.deps import ClientDep, SettingsDep
from api.errors import InvalidRequest
from api.routes import routes_api as admin
from api.schemas import BatchScheduling
from backfill.routes.gates import SETTINGS_GATES
from backfill.routes.reasons import LEGITIMATE_WAITS
from backfill.routes.settings import RouteSettings

PLAIN_FIELDS = ("max_concurrent_lines", "priority_hint")
"""The settings that are not gates (a number each; blank `priority_hint`: off)."""


def form_values(s: RouteSettings) -> dict[str, Any]:
    """The Edit form's fields (named by their path in the settings document) for `s`."""
    values: dict[str, Any] = {
        name: "" if getattr(s, name) is None else str(getattr(s, name)) for name in PLAIN_FIELDS
    }
    for gate in SETTINGS_GATES:
        values |= gate.form_values(gate.setting(s))
    return values


def posted_values(form: FormData) -> dict[str, Any]:
    lists = {f"{g.name}.{f.key}" for g in SETTINGS_GATES for f in g.form if f.choices}
    values: dict[str, Any] = {
        k: str(v).strip() for k, v in form.multi_items() if k not in ("csrf_token", *lists)
    }
    for name in lists:
        values[name] = [str(d) for d in form.getlist(name)]
    return values


def settings_document(v: dict[str, Any]) -> dict[str, Any]:
    """The PUT body the form stands for: a gate whose fields are all blank is off (null)."""
    doc: dict[str, Any] = {"max_concurrent_lines": v.get("max_concurrent_lines", "")}
    for gate in SETTINGS_GATES:
        doc[gate.name] = gate.document(v)
    doc["priority_hint"] = v.get("priority_hint", "") or None
    return doc


def field_errors(err: ValidationError) -> dict[str, str]:
    """Validation errors by the form field (or fieldset) they belong to."""
    out: dict[str, str] = {}
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "settings"
        msg = str(e["msg"]).removeprefix("Value error, ")
        out.setdefault(where, msg)
    return out


async def _scheduling(
    request: Request, route_id: str, session: SessionDep, client: ClientDep, settings: SettingsDep
) -> BatchScheduling:
    return await admin.get_batch_scheduling(route_id, request, settings, client, session.identity)


@router.get("/routes", response_model=None)
async def routes_page(
    request: Request, session: SessionDep, client: ClientDep, settings: SettingsDep
) -> Response:
    admin.require_admin(session.identity, write=False)
    ids = [(m.id, r.id) for m in settings.models for r in m.routes]
    docs = await asyncio.gather(
        *(_scheduling(request, rid, session, client, settings) for _, rid in ids)
    )
    rows = [(model, doc) for (model, _), doc in zip(ids, docs, strict=True)]
    return render(request, "routes.html", session, rows=rows)


async def _route_page(
    request: Request,
    route_id: str,
    session: SessionDep,
    client: ClientDep,
    settings: SettingsDep,
    *,
    values: dict[str, Any] | None = None,
    errors: dict[str, str] | None = None,
    status_code: int = 200,
) -> Response:
    admin.require_admin(session.identity, write=False)
    doc = await _scheduling(request, route_id, session, client, settings)
    now = time.time()
    route = settings.route(route_id)
    return render(
        request,
        "route.html",
        session,
        status_code,
        doc=doc,
        route=route,
        chart=route_chart(state(request).samples.recent(route_id, now), now),
        values=values if values is not None else form_values(doc.settings),
        errors=errors or {},
        gates=SETTINGS_GATES,
        legitimate=LEGITIMATE_WAITS,
        can_edit=session.identity.role == "platform_admin",
        saved=request.query_params.get("saved") == "1",
    )


@router.get("/routes/{route_id}", response_model=None)
async def route_page(
    request: Request, route_id: str, session: SessionDep, client: ClientDep, settings: SettingsDep
) -> Response:
    return await _route_page(request, route_id, session, client, settings)


@router.post("/routes/{route_id}/settings", response_model=None)
async def edit_route(
    request: Request, route_id: str, session: SessionDep, client: ClientDep, settings: SettingsDep
) -> Response:
    admin.require_admin(session.identity, write=True)
    form = await checked_form(request, session)
    values = posted_values(form)
    try:
        new = RouteSettings.model_validate(settings_document(values))
        await admin.put_batch_scheduling(route_id, new, request, settings, client)
    except ValidationError as err:
        errors = field_errors(err)
    except InvalidRequest as err:
        errors = {err.param or "settings": err.message}
    else:
        return RedirectResponse(f"/console/routes/{route_id}?saved=1", status_code=303)
    return await _route_page(
        request, route_id, session, client, settings, values=values, errors=errors, status_code=400
    )
