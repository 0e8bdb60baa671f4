"""The web console in a real browser (Debian's Chromium via Playwright) against the real stack:
a Temporal dev server, a worker and an api process, and the simulator as the model server.

One stack for the module; batches are created through the API with the `openai` SDK, as a user
would, and everything else happens on the pages. Waits are bounded: Playwright's `expect` with
its timeout, or `poll_until` on what the page shows.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import pytest_asyncio
from playwright.async_api import Browser, Page, expect

from tests.browser.conftest import shot_path, sign_in
from tests.e2e.stack import Stack, submit, wait_terminal
from tests.polling import poll_until
from tools.sim import SimConfig

MEMBER, OTHER_MEMBER, ADMIN, AUDITOR = (
    "sk-test-alpha",
    "sk-test-beta",
    "sk-test-admin",
    "sk-test-auditor",
)
LINES = 40


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def stack(tmp_path_factory: pytest.TempPathFactory, dev_server: Any) -> AsyncIterator[Stack]:
    # 400 ms lines, 2 at a time: a 40-line batch runs for several seconds, long enough to watch.
    s = Stack(
        tmp_path_factory.mktemp("console"),
        dev_server.address,
        cap=2,
        sim=SimConfig(model_names=[], latency_ms=400),
    )
    async with s.running():
        yield s


async def progress(page: Page, batch_id: str, where: str = "") -> tuple[int, int]:
    """(finished, total) as the page's progress bar says (aria-valuenow / aria-valuemax)."""
    bar = page.locator(f'{where}[role="progressbar"]')
    now, top = await bar.get_attribute("aria-valuenow"), await bar.get_attribute("aria-valuemax")
    return int(now or 0), int(top or 0)


async def test_roles_and_the_session_cookie(browser: Browser, stack: Stack) -> None:
    older = await submit(stack, 2, key=OTHER_MEMBER, prefix="beta-old")
    theirs = await submit(stack, 2, key=OTHER_MEMBER, prefix="beta")
    member = await sign_in(browser, stack.api_url, MEMBER)
    await expect(member.get_by_test_id("who")).to_contain_text(stack.workspaces["alpha"])
    await expect(member.get_by_role("link", name="Routes")).to_have_count(0)
    # The server refuses what the page does not show.
    resp = await member.goto("/console/routes")
    assert resp is not None and resp.status == 403
    resp = await member.goto(f"/console/routes/{stack.route_id}")
    assert resp is not None and resp.status == 403
    resp = await member.goto(f"/console/batches/{theirs}")
    assert resp is not None and resp.status == 404  # another workspace's: not even its existence
    await member.goto("/console/batches")
    await expect(member.locator(f'tr[data-batch="{theirs}"]')).to_have_count(0)
    # The session cookie: HttpOnly, SameSite=Strict, a random id that is not the key.
    cookies = {c["name"]: c for c in await member.context.cookies()}
    session = cookies["backfill_console"]
    assert session["httpOnly"] and session["sameSite"] == "Strict"
    assert MEMBER not in session["value"] and len(session["value"]) >= 40

    admin = await sign_in(browser, stack.api_url, ADMIN)
    await expect(admin.get_by_role("link", name="Routes")).to_have_count(1)
    await admin.get_by_label("Workspace").fill(stack.workspaces["beta"])
    await admin.get_by_role("button", name="Apply").click()
    await expect(admin.locator(f'tr[data-batch="{theirs}"]')).to_have_count(1)
    # Paging: one per page, newest first, to the last page (other tests of this module may
    # have added batches to this workspace; `theirs` was created right after `older`).
    await admin.get_by_label("Per page").fill("1")
    await admin.get_by_role("button", name="Apply").click()
    seen: list[str] = []
    for _ in range(20):
        await expect(admin.locator("tr[data-batch]")).to_have_count(1)
        row = await admin.locator("tr[data-batch]").get_attribute("data-batch")
        assert row is not None and row not in seen
        seen.append(row)
        if await admin.get_by_role("link", name="Next page").count() == 0:
            break
        await admin.get_by_role("link", name="Next page").click()
        await expect(admin.locator(f'tr[data-batch="{row}"]')).to_have_count(0)
    assert older in seen and seen.index(theirs) == seen.index(older) - 1, seen
    await expect(admin.get_by_role("link", name="First page")).to_have_count(1)
    # A status filter the batches do not match.
    await admin.get_by_label("Status").select_option("expired")
    await admin.get_by_role("button", name="Apply").click()
    await expect(admin.locator("tr[data-batch]")).to_have_count(0)
    auditor = await sign_in(browser, stack.api_url, AUDITOR)
    await expect(auditor.locator(f'tr[data-batch="{theirs}"]')).to_have_count(1)

    # A wrong key, by keyboard alone: the form again, with the error next to the field.
    stranger = await browser.new_page(base_url=stack.api_url)
    await stranger.goto("/console/sign-in")
    await stranger.keyboard.press("Tab")
    await expect(stranger.get_by_role("link", name="Skip to content")).to_be_focused()
    await stranger.keyboard.press("Tab")
    await expect(stranger.get_by_label("API key")).to_be_focused()
    await stranger.keyboard.type("sk-not-a-key")
    await stranger.keyboard.press("Enter")
    await expect(stranger.locator("#signin-error")).to_have_text("Incorrect API key.")
    await expect(stranger.get_by_label("API key")).to_have_attribute("aria-invalid", "true")
    # Signing out ends the session on the server.
    await member.get_by_role("button", name="Sign out").click()
    await expect(member).to_have_url(re.compile(r"/console/sign-in$"))
    await member.context.add_cookies([{**session, "sameSite": "Strict"}])  # type: ignore[list-item]
    await member.goto("/console/batches")
    await expect(member).to_have_url(re.compile(r"/console/sign-in$"))
    for p in (member, admin, auditor, stranger):
        await p.context.close()


async def test_progress_bar_moves_and_the_output_downloads(
    browser: Browser, stack: Stack, tmp_path: Path
) -> None:
    batch_id = await submit(stack, LINES, key=MEMBER, prefix="watch")
    page = await sign_in(browser, stack.api_url, MEMBER)
    row = f'tr[data-batch="{batch_id}"] '
    seen: list[int] = []
    shot = False

    async def sample() -> tuple[int, int]:
        nonlocal shot
        done, total = await progress(page, batch_id, row)
        if not seen or seen[-1] != done:
            seen.append(done)
        if 0 < done < LINES and not shot:
            await page.screenshot(path=shot_path(tmp_path, "batches.png"), full_page=True)
            shot = True
        return done, total

    # No reload: the page refreshes itself.
    await poll_until(
        sample, lambda v: v == (LINES, LINES), timeout=180, what="the bar to reach 40/40"
    )
    assert seen == sorted(seen), seen
    assert any(0 < v < LINES for v in seen), f"the bar never showed a step between: {seen}"
    await expect(page.locator(row + ".status")).to_have_text("completed", timeout=60_000)

    await page.get_by_role("link", name=batch_id).click()
    async with page.expect_download() as download_info:
        await page.get_by_role("link", name="Download output file").click()
    download = await download_info.value
    path = await download.path()
    ids = [json.loads(line)["custom_id"] for line in Path(path).read_text().splitlines()]
    assert ids == [f"watch-{i}" for i in range(LINES)]
    await page.context.close()


async def test_pause_and_resume_from_the_batch_page(
    browser: Browser, stack: Stack, tmp_path: Path
) -> None:
    batch_id = await submit(stack, LINES, key=MEMBER, prefix="pause")
    client = stack.client(MEMBER)
    page = await sign_in(browser, stack.api_url, MEMBER)
    await page.goto(f"/console/batches/{batch_id}")
    await page.get_by_role("button", name="Pause").click()
    await expect(page.locator("#h-progress")).to_contain_text("(paused)")
    await expect(page.locator("#batch-live")).to_contain_text("Paused by alpha-key")
    batch = await client.batches.retrieve(batch_id)
    assert batch.model_extra is not None and batch.model_extra["backfill"]["paused"] is True
    # Once its running lines drained, every route of the batch says so.
    await expect(page.get_by_role("cell", name="paused", exact=True)).to_have_count(1)
    await page.screenshot(path=shot_path(tmp_path, "batch.png"), full_page=True)

    await page.get_by_role("button", name="Resume").click()
    await expect(page.locator("#h-progress")).not_to_contain_text("(paused)")
    await expect(page.locator("#h-progress")).to_contain_text("completed", timeout=180_000)
    assert await progress(page, batch_id) == (LINES, LINES)
    done = await wait_terminal(client, batch_id, within=30)
    assert done.status == "completed" and done.request_counts.completed == LINES
    await page.context.close()


async def test_admin_edits_route_settings_and_sees_validation_errors(
    browser: Browser, stack: Stack, tmp_path: Path
) -> None:
    # Running lines for the chart while the page is open: 400 lines, cancelled at the end (at
    # 120 it sometimes finished first on a slow CI machine, and the cancel met a completed batch).
    busy = await submit(stack, 10 * LINES, key=ADMIN, prefix="chart")
    page = await sign_in(browser, stack.api_url, ADMIN)
    await page.get_by_role("link", name="Routes").click()
    await page.get_by_role("link", name=stack.route_id).click()
    await expect(page.get_by_role("heading", name="Batch scheduling")).to_be_visible()

    lines_at_once = page.get_by_label("Batch lines at once")
    await lines_at_once.fill("500")
    await page.get_by_role("button", name="Save settings").click()
    await expect(page.locator("#err-max_concurrent_lines")).to_contain_text("256")
    await expect(lines_at_once).to_have_attribute("aria-invalid", "true")
    # The API's own check beyond the model: a metrics URL that is not an approved upstream's.
    await lines_at_once.fill("3")
    await page.get_by_label("Metrics URL").fill("http://198.51.100.7/metrics")
    await page.get_by_label("Max waiting requests").fill("0")
    await page.get_by_role("button", name="Save settings").click()
    await expect(page.locator("#err-server_load-metrics_url")).to_be_visible()
    await expect(page.locator("#err-max_concurrent_lines")).to_have_count(0)

    await page.get_by_label("Metrics URL").fill("")
    await page.get_by_label("Max waiting requests").fill("")
    await page.get_by_role("button", name="Save settings").click()
    await expect(page.get_by_role("status")).to_have_text("Settings saved.")
    await expect(page.get_by_test_id("running")).to_contain_text("of 3 at most")
    url = f"{stack.api_url}/api/v1/platform/deployments/{stack.route_id}/batch-scheduling"
    headers = {"Authorization": f"Bearer {ADMIN}"}
    async with httpx.AsyncClient(headers=headers, timeout=30) as http:
        doc = (await http.get(url)).json()
        assert doc["settings"]["max_concurrent_lines"] == 3
        assert doc["settings"]["server_load"] is None

        # The chart samples while the page is open, and redraws itself.
        chart = page.locator("#route-chart")
        await poll_until(
            lambda: chart.get_attribute("data-samples"),
            lambda n: int(n or 0) >= 4,
            timeout=90,
            what="4 chart samples on the self-refreshing route page",
            interval=0.5,
        )
        await expect(chart.locator("polyline.series-running")).to_have_count(1)
        await page.screenshot(path=shot_path(tmp_path, "route.png"), full_page=True)
        try:
            await stack.client(ADMIN).batches.cancel(busy)
        except openai.ConflictError:  # it ended first: nothing left to stop
            assert (await stack.client(ADMIN).batches.retrieve(busy)).status == "completed"
        restored = await http.put(url, json={"max_concurrent_lines": stack.cap})
        assert restored.status_code == 200, restored.text
    await page.context.close()


async def test_auditor_reads_settings_and_batches_but_changes_nothing(
    browser: Browser, stack: Stack
) -> None:
    batch_id = await submit(stack, 2, key=MEMBER, prefix="audit")
    page = await sign_in(browser, stack.api_url, AUDITOR)
    await page.goto(f"/console/routes/{stack.route_id}")
    readonly = page.get_by_test_id("settings-readonly")
    await expect(readonly).to_contain_text("Batch lines at once")
    await expect(page.locator("form.settings")).to_have_count(0)
    await expect(page.get_by_role("button", name="Save settings")).to_have_count(0)
    token = await page.locator('input[name="csrf_token"]').first.get_attribute("value")
    # Even with a valid CSRF token, the server refuses an auditor's change.
    resp = await page.request.post(
        f"/console/routes/{stack.route_id}/settings",
        form={"csrf_token": token or "", "max_concurrent_lines": "9"},
    )
    assert resp.status == 403

    await page.goto(f"/console/batches/{batch_id}")
    await expect(page.get_by_text("Read-only: an auditor can't pause")).to_be_visible()
    await expect(page.get_by_role("button", name="Pause")).to_have_count(0)
    resp = await page.request.post(
        f"/console/batches/{batch_id}/pause", form={"csrf_token": token or ""}
    )
    assert resp.status == 403 and "read_only" in await resp.text()
    await page.context.close()


NO_SIDEWAYS_SCROLL = "document.documentElement.scrollWidth <= window.innerWidth"


async def test_pages_fit_a_phone(browser: Browser, stack: Stack, tmp_path: Path) -> None:
    """At a phone's width nothing scrolls sideways: tables become labelled cards."""
    await submit(stack, 2, key=MEMBER, prefix="phone")
    phone = {"viewport": {"width": 390, "height": 844}, "is_mobile": True, "has_touch": True}
    page = await sign_in(browser, stack.api_url, ADMIN, **phone)
    for path in ("/console/batches", f"/console/routes/{stack.route_id}", "/console/usage"):
        await page.goto(path)
        assert await page.evaluate(NO_SIDEWAYS_SCROLL), path
    await page.goto("/console/batches")
    await page.screenshot(path=shot_path(tmp_path, "batches-phone.png"), full_page=True)
    await page.context.close()


async def test_usage_page_shows_the_workspace_tokens(browser: Browser, stack: Stack) -> None:
    batch_id = await submit(stack, 3, key=OTHER_MEMBER, prefix="usage")
    done = await wait_terminal(stack.client(OTHER_MEMBER), batch_id, within=120)
    assert done.status == "completed"
    page = await sign_in(browser, stack.api_url, OTHER_MEMBER)
    await page.get_by_role("link", name="Usage").click()
    beta = stack.workspaces["beta"]
    row = page.locator("tbody tr").filter(has_text=beta).filter(has_text="batch")

    async def shown() -> int:
        await page.reload()
        return await row.count()

    # The journal is flushed within half a second of each attempt, by the worker.
    await poll_until(shown, lambda n: n == 1, timeout=30, what="beta's batch usage row")
    tokens = int(await row.locator('td[data-label="Total tokens"]').inner_text())
    assert tokens >= done.usage.total_tokens > 0
    # A member sees its own workspace only, and the chart has today's batch bar.
    assert await page.locator("tbody tr").filter(has_text=stack.workspaces["alpha"]).count() == 0
    bars = page.locator("svg rect.bar-batch")
    heights = [float(await b.get_attribute("height") or 0) for b in await bars.all()]
    assert heights and heights[-1] > 0 and not any(heights[:-1])
    await page.context.close()


async def test_a_forged_post_without_the_csrf_token_is_refused(
    browser: Browser, stack: Stack
) -> None:
    batch_id = await submit(stack, LINES, key=MEMBER, prefix="forged")
    page = await sign_in(browser, stack.api_url, MEMBER)
    for form in ({}, {"csrf_token": "not-the-token"}):
        resp = await page.request.post(f"/console/batches/{batch_id}/pause", form=form)
        assert resp.status == 403, (form, resp.status)
    resp = await page.request.post("/console/sign-out", form={})
    assert resp.status == 403
    batch = await stack.client(MEMBER).batches.retrieve(batch_id)
    assert batch.model_extra is not None and batch.model_extra["backfill"]["paused"] is False
    # The session survived the forged sign-out, and the real form still works.
    await page.goto(f"/console/batches/{batch_id}")
    await page.get_by_role("button", name="Cancel").click()
    await expect(page.locator("#h-progress")).to_contain_text("cancel")
    await page.context.close()
