"""Batch jobs: the single jobs (`/gateway/v1/batches`) with filters, one job's page with its
attempts and identity metadata, its controls, and its output's download.

Reads and changes go through the jobs API's own functions (`api.jobs`, `api.admin_jobs`) with
the session's identity: an admin or auditor sees every workspace's jobs, a member only its own
workspace's (another's job is a 404, as in `/gateway/v1/batches`); an auditor changes nothing
and never downloads content.
"""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from fastapi import Query, Request
from fastapi.responses import RedirectResponse, Response

from api import jobs
from api.admin_jobs import admin_view, job_page
from api.console.web import SessionDep, checked_form, render, router
from api.deps import ClientDep, SettingsDep, StoreDep
from backfill.jobs import TERMINAL_JOB_STATES, Job, JobState

JOB_STATES: tuple[str, ...] = get_args(JobState)


def job_actions(job: Job, role: str) -> list[str]:
    """The controls this role may use on this job now (the server checks again)."""
    if role == "auditor" or job.state in TERMINAL_JOB_STATES or job.state == "cancelling":
        return []
    return ["resume" if job.state in ("pausing", "paused") else "pause", "cancel"]


@router.get("/jobs", response_model=None)
async def jobs_page(
    request: Request,
    session: SessionDep,
    client: ClientDep,
    store: StoreDep,
    settings: SettingsDep,
    state: str = "",
    model: str = "",
    workspace: str = "",
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> Response:
    identity = session.identity
    # A member sees its own workspace only, whatever the query says.
    ws = (workspace or None) if identity.can_see(None) else identity.workspace
    page = await job_page(client, store, identity, ws, state or None, model or None, after, limit)
    return render(
        request,
        "jobs.html",
        session,
        rows=page.data,
        has_more=page.has_more,
        next_after=page.last_id,
        first_page=after is None,
        filters={"state": state, "model": model, "workspace": ws or "", "limit": limit},
        states=JOB_STATES,
        models=[m.id for m in settings.models],
    )


@router.get("/jobs/{job_id}", response_model=None)
async def job_detail_page(
    request: Request, job_id: str, session: SessionDep, client: ClientDep, store: StoreDep
) -> Response:
    batch = await jobs.job_batch(client, session.identity, job_id)
    job = await admin_view(client, store, batch)
    return render(
        request,
        "job.html",
        session,
        job=job,
        actions=job_actions(job, session.identity.role),
    )


Action = Literal["pause", "resume", "cancel"]


@router.post("/jobs/{job_id}/{action}", response_model=None)
async def control_job(
    request: Request, job_id: str, action: Action, session: SessionDep, client: ClientDep
) -> Response:
    await checked_form(request, session)
    await jobs.control_batch(action, job_id, client, session.identity)
    return RedirectResponse(f"/console/jobs/{job_id}?done={action}", status_code=303)


@router.get("/jobs/{job_id}/output", response_model=None)
async def job_output(
    job_id: str, session: SessionDep, client: ClientDep, store: StoreDep
) -> Response:
    """The completed job's answer (JSON), as a download; checked like `GET
    /gateway/v1/batches/{id}/output` (409 before it completed, 403 for an auditor)."""
    answer = await jobs.output(job_id, client, store, session.identity)
    answer.headers["Content-Disposition"] = f'attachment; filename="{job_id}-output.json"'
    return answer
