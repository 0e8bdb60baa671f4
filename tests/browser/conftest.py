"""Browser tests: Playwright driving Debian's Chromium against the real stack.

Never `playwright install`: the browser is `/usr/bin/chromium` (`make chromium` installs the
Debian package). One browser for the whole session; each test gets fresh contexts (cookies).

Screenshots: with `BACKFILL_SCREENSHOTS=1` the tests write docs/console/*.png (the README's
pictures); otherwise into the test's temporary directory, so a normal run never dirties the tree
but still takes them.
"""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from playwright.async_api import Browser, BrowserContext, Page, async_playwright, expect

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
DOCS_SHOTS = Path(__file__).resolve().parents[2] / "docs" / "console"


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def browser() -> AsyncIterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: run `make chromium` (apt-get install -y chromium)")
    async with async_playwright() as p:
        b = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            await b.close()


async def sign_in(browser: Browser, base_url: str, key: str, **options: object) -> Page:
    """A page in a fresh context, signed in to the console with `key` (on the batches page)."""
    context: BrowserContext = await browser.new_context(base_url=base_url, **options)  # type: ignore[arg-type]
    context.set_default_timeout(30_000)
    page = await context.new_page()
    await page.goto("/console/sign-in")
    await page.get_by_label("API key").fill(key)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page).to_have_url(re.compile(r"/console/batches$"))
    return page


def shot_path(tmp_path: Path, name: str) -> Path:
    """Where a screenshot goes: docs/console/ with BACKFILL_SCREENSHOTS=1, else tmp_path."""
    if os.environ.get("BACKFILL_SCREENSHOTS") == "1":
        DOCS_SHOTS.mkdir(parents=True, exist_ok=True)
        return DOCS_SHOTS / name
    return tmp_path / name
