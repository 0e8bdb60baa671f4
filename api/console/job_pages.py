"""Batch jobs: the single jobs (`/gateway/v1/batches`) with filters, one job's page with its
attempts and identity metadata, its controls, and its output's download.

Reads and changes go through the jobs API's own functions (`api.jobs.jobs_api`,
`api.platform_admin.jobs`) with the session's identity: an admin or auditor sees every workspace's
jobs, a member only its own workspace's (another's job is a 404, as in `/gateway/v1/batches`); an
auditor changes nothing and never downloads content.
"""

from __future__ import annotations

from typing import get_args

from fastapi import Request
from fastapi.responses import RedirectResponse, Response

from api.console.lists import Action, ListQueryDep, control, render_list
from api.console.web import SessionDep, render, router
from api.deps import BuffersDep, ClientDep, SettingsDep, StoreDep
from api.jobs import jobs_api as jobs
from api.platform_admin.jobs import admin_view, job_page
from backfill.batches.jobs import TERMINAL_JOB_STATES, Job, JobState

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
    query: ListQueryDep,
    state: str = "",
) -> Response:
    ws = query.workspace_for(session)
    page = await job_page(
        client,
        store,
        session.identity,
        ws,
        state or None,
        query.model or None,
        query.after,
        query.limit,
    )
    return render_list(
        request,
        "jobs.html",
        session,
        settings,
        query,
        rows=page.data,
        has_more=page.has_more,
        last_id=page.last_id,
        own={"state": state},
        states=JOB_STATES,
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


@router.post("/jobs/{job_id}/{action}", response_model=None)
async def control_job(
    request: Request, job_id: str, action: Action, session: SessionDep, client: ClientDep
) -> RedirectResponse:
    return await control(
        request,
        session,
        f"jobs/{job_id}",
        action,
        lambda: jobs.control_batch(action, job_id, client, session.identity),
    )


@router.get("/jobs/{job_id}/output", response_model=None)
async def job_output(
    job_id: str,
    session: SessionDep,
    client: ClientDep,
    store: StoreDep,
    settings: SettingsDep,
    buffers: BuffersDep,
) -> Response:
    """The completed job's answer (JSON), as a download; checked like `GET
    /gateway/v1/batches/{id}/output` (409 before it completed, 403 for an auditor)."""
    answer = await jobs.output(job_id, client, store, session.identity, settings, buffers)
    answer.headers["Content-Disposition"] = f'attachment; filename="{job_id}-output.json"'
    return answer
