"""The console's "Batch jobs" pages in Chromium against the real stack, as a platform admin, an
auditor and a member: the list and its filters (workspace, state, model), a job's attempts and
identity metadata, pause/resume/cancel, and the output's download.

Jobs are created through `/gateway/v1/batches` as a user would; everything else happens on the
pages. Waits are bounded (Playwright's `expect`, `poll_until`).
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai.types.chat
import pytest
import pytest_asyncio
from playwright.async_api import Browser, Page, expect

from backfill.platform.config import hash_key
from tests.browser.conftest import shot_path, sign_in
from tests.browser.test_console import NO_SIDEWAYS_SCROLL
from tests.e2e.stack import Stack, auth
from tests.e2e.test_jobs import set_window
from tests.polling import poll_until
from tools.sim import SimConfig

MEMBER, OTHER_MEMBER, ADMIN, AUDITOR = (
    "sk-test-alpha",
    "sk-test-beta",
    "sk-test-admin",
    "sk-test-auditor",
)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def stack(tmp_path_factory: pytest.TempPathFactory, dev_server: Any) -> AsyncIterator[Stack]:
    s = Stack(
        tmp_path_factory.mktemp("job-pages"),
        dev_server.address,
        cap=1,
        sim=SimConfig(model_names=[], latency_ms=50),
    )
    async with s.running():
        yield s


@pytest_asyncio.fixture(loop_scope="session")
async def http(stack: Stack) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=60) as c:
        yield c


async def create_job(http: httpx.AsyncClient, key: str, text: str) -> str:
    body = {"model": "demo", "messages": [{"role": "user", "content": text}]}
    r = await http.post(
        "/gateway/v1/batches",
        json={"path": "/v1/chat/completions", "body": body},
        headers=auth(key),
    )
    assert r.status_code == 202, r.text
    return r.json()["id"]  # type: ignore[no-any-return]


async def job_state(http: httpx.AsyncClient, job_id: str) -> str:
    r = await http.get(f"/gateway/ui-api/batches/{job_id}", headers=auth(ADMIN))
    assert r.status_code == 200, r.text
    return r.json()["state"]  # type: ignore[no-any-return]


async def completed(http: httpx.AsyncClient, *job_ids: str) -> None:
    for job_id in job_ids:
        await poll_until(
            lambda job_id=job_id: job_state(http, job_id),  # type: ignore[misc]
            lambda s: s in ("completed", "failed", "cancelled"),
            timeout=120,
            what=f"job {job_id} to end",
        )
        assert await job_state(http, job_id) == "completed"


async def rows(page: Page) -> list[str]:
    return [
        r or ""
        for r in await page.locator("tr[data-job]").evaluate_all(
            "rows => rows.map(r => r.getAttribute('data-job'))"
        )
    ]


async def apply(page: Page, **filters: str) -> None:
    for label, value in filters.items():
        field = page.get_by_label(label.capitalize(), exact=True)
        if label in ("state", "model"):
            await field.select_option(value)
        else:
            await field.fill(value)
    await page.get_by_role("button", name="Apply").click()
    await expect(page).to_have_url(re.compile(r"/console/jobs\?"))


async def test_member_sees_its_own_jobs_and_downloads_the_answer(
    browser: Browser, stack: Stack, http: httpx.AsyncClient, tmp_path: Path
) -> None:
    mine = await create_job(http, MEMBER, "mine")
    theirs = await create_job(http, OTHER_MEMBER, "theirs")
    await completed(http, mine, theirs)

    page = await sign_in(browser, stack.api_url, MEMBER)
    await page.get_by_role("link", name="Batch jobs").click()
    await expect(page.get_by_role("heading", name="Batch jobs")).to_be_visible()
    await expect(page.locator(f'tr[data-job="{mine}"]')).to_have_count(1)
    assert theirs not in await rows(page)
    # The workspace is not the member's to choose: a query naming another shows its own.
    await expect(page.get_by_label("Workspace")).to_have_attribute("readonly", "")
    await page.goto(f"/console/jobs?workspace={stack.workspaces['beta']}")
    await expect(page.locator(f'tr[data-job="{mine}"]')).to_have_count(1)
    assert theirs not in await rows(page)
    resp = await page.goto(f"/console/jobs/{theirs}")
    assert resp is not None and resp.status == 404  # another workspace's job

    await page.goto("/console/jobs")
    await page.get_by_role("link", name=mine).click()
    await expect(page.get_by_test_id("attempt-count")).to_have_text("1")
    identity = page.get_by_test_id("identity")
    await expect(identity).to_contain_text(stack.workspaces["alpha"])
    await expect(identity).to_contain_text(f"key_{hash_key(MEMBER)[:12]}")
    await expect(identity).to_contain_text("member")
    assert MEMBER not in await page.content()
    async with page.expect_download() as info:
        await page.get_by_role("link", name="Download the answer (JSON)").click()
    download = await info.value
    answer = json.loads(Path(await download.path()).read_text())
    assert openai.types.chat.ChatCompletion.model_validate(answer).model == "demo"
    await page.screenshot(path=shot_path(tmp_path, "job.png"), full_page=True)
    await page.context.close()


async def test_admin_filters_and_controls_every_workspace_job(
    browser: Browser, stack: Stack, http: httpx.AsyncClient, tmp_path: Path
) -> None:
    ws = stack.workspaces
    done_alpha = await create_job(http, MEMBER, "a")
    done_beta = await create_job(http, OTHER_MEMBER, "b")
    await completed(http, done_alpha, done_beta)
    await set_window(stack, http, closed=True)  # the next job stays queued
    try:
        held = await create_job(http, OTHER_MEMBER, "held")
        page = await sign_in(browser, stack.api_url, ADMIN)
        await page.get_by_role("link", name="Batch jobs").click()
        everything = await rows(page)
        assert {done_alpha, done_beta, held} <= set(everything)
        await page.screenshot(path=shot_path(tmp_path, "jobs.png"), full_page=True)

        # Other tests of this module add jobs to these workspaces: newest first, these on top.
        await apply(page, workspace=ws["beta"])
        beta = await rows(page)
        assert beta[:2] == [held, done_beta] and done_alpha not in beta
        await apply(page, state="queued")
        assert await rows(page) == [held]
        await apply(page, state="completed")
        finished = await rows(page)
        assert done_beta in finished and held not in finished and done_alpha not in finished
        await apply(page, state="", workspace="", model="demo")
        assert {done_alpha, done_beta, held} <= set(await rows(page))

        await page.goto(f"/console/jobs/{held}")
        await expect(page.locator("#h-state")).to_contain_text("queued")
        await expect(page.get_by_test_id("identity")).to_contain_text(ws["beta"])
        await expect(
            page.get_by_text("can be downloaded once the job is completed")
        ).to_be_visible()
        await page.get_by_role("button", name="Pause").click()
        await expect(page.locator("#h-state")).to_contain_text("paused")
        await expect(page.locator("#job-live")).to_contain_text("ops-key")
        await page.goto(f"/console/jobs?workspace={ws['beta']}&state=paused")
        assert await rows(page) == [held]
        await page.goto(f"/console/jobs/{held}")
        await page.get_by_role("button", name="Resume").click()
        await expect(page.locator("#h-state")).to_contain_text("queued")
        await page.get_by_role("button", name="Cancel").click()
        await expect(page.locator("#h-state")).to_contain_text("cancelled")
        await expect(page.get_by_role("button", name="Pause")).to_have_count(0)

        # Any workspace's answer downloads for the admin.
        await page.goto(f"/console/jobs/{done_alpha}")
        async with page.expect_download() as info:
            await page.get_by_role("link", name="Download the answer (JSON)").click()
        answer = json.loads(Path(await (await info.value).path()).read_text())
        assert answer["object"] == "chat.completion"
        await page.context.close()
    finally:
        await set_window(stack, http, closed=False)


async def test_auditor_reads_every_job_but_changes_nothing(
    browser: Browser, stack: Stack, http: httpx.AsyncClient
) -> None:
    job_id = await create_job(http, MEMBER, "audited")
    await completed(http, job_id)
    page = await sign_in(browser, stack.api_url, AUDITOR)
    await page.get_by_role("link", name="Batch jobs").click()
    await expect(page.locator(f'tr[data-job="{job_id}"]')).to_have_count(1)
    await page.get_by_role("link", name=job_id).click()
    await expect(page.get_by_test_id("identity")).to_contain_text(stack.workspaces["alpha"])
    await expect(page.get_by_text("Read-only: an auditor can't pause")).to_be_visible()
    await expect(page.get_by_role("button", name="Cancel")).to_have_count(0)
    await expect(page.get_by_text("Auditors can't read the answer")).to_be_visible()
    # The server refuses what the page does not offer.
    resp = await page.request.get(f"/console/jobs/{job_id}/output")
    assert resp.status == 403 and "insufficient_role" in await resp.text()
    token = await page.locator('input[name="csrf_token"]').first.get_attribute("value")
    resp = await page.request.post(
        f"/console/jobs/{job_id}/pause", form={"csrf_token": token or ""}
    )
    assert resp.status == 403 and "read_only" in await resp.text()
    await page.context.close()


async def test_job_pages_fit_a_phone(
    browser: Browser, stack: Stack, http: httpx.AsyncClient
) -> None:
    job_id = await create_job(http, MEMBER, "phone")
    phone = {"viewport": {"width": 390, "height": 844}, "is_mobile": True, "has_touch": True}
    page = await sign_in(browser, stack.api_url, ADMIN, **phone)
    for path in ("/console/jobs", f"/console/jobs/{job_id}"):
        await page.goto(path)
        assert await page.evaluate(NO_SIDEWAYS_SCROLL), path
    await page.context.close()
