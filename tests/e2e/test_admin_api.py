"""The admin API's listing over every workspace: filters (workspace, status, model, created
range) and the `after` cursor, on the real stack."""

from __future__ import annotations

from typing import Any

import httpx

from tests.e2e.stack import Stack, assert_error, jsonl, submit, wait_terminal
from tests.polling import poll_until

ADMIN, AUDITOR = "sk-test-admin", "sk-test-auditor"


async def test_admin_listing_filters_and_pages(shared_stack: Stack) -> None:
    stack = shared_stack
    alpha_done = await submit(stack, 2, key="sk-test-alpha", prefix="a")
    beta_done = await submit(stack, 2, key="sk-test-beta", prefix="b")
    # A batch that fails validation (an unknown model) in alpha.
    alpha = stack.client("sk-test-alpha")
    bad_file = await alpha.files.create(file=("bad.jsonl", jsonl(1, model="nope")), purpose="batch")
    alpha_failed = (
        await alpha.batches.create(
            input_file_id=bad_file.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
    ).id
    for key, batch_id in (
        ("sk-test-alpha", alpha_done),
        ("sk-test-beta", beta_done),
        ("sk-test-alpha", alpha_failed),
    ):
        await wait_terminal(stack.client(key), batch_id, within=120)
    mine = {alpha_done, beta_done, alpha_failed}
    ws = stack.workspaces

    async with httpx.AsyncClient(base_url=stack.api_url, timeout=60) as http:

        async def ids(key: str = AUDITOR, **params: Any) -> list[str]:
            r = await http.get("/api/v1/admin/batches", headers=stack.auth(key), params=params)
            assert r.status_code == 200, r.text
            return [b["id"] for b in r.json()["data"]]

        # Status attributes are upserted as batches move: wait until visibility shows the ends.
        await poll_until(
            lambda: ids(status="completed", workspace=ws["alpha"]),
            lambda got: got == [alpha_done],
            timeout=30,
            what="alpha's completed batch listed by status",
        )
        assert await ids(workspace=ws["alpha"]) == [alpha_failed, alpha_done]
        assert await ids(workspace=ws["beta"]) == [beta_done]
        assert await ids(workspace=ws["alpha"], status="failed") == [alpha_failed]
        assert await ids(workspace=ws["beta"], status="failed") == []
        assert await ids(workspace=ws["alpha"], model="demo") == [alpha_done]
        # Created range: nothing after the newest, everything of alpha from the oldest on.
        created = {
            b: (await http.get(f"/api/v1/admin/batches/{b}", headers=stack.auth(AUDITOR))).json()[
                "created_at"
            ]
            for b in mine
        }
        newest = max(created.values())
        assert await ids(workspace=ws["alpha"], created_after=newest + 1) == []
        assert await ids(
            workspace=ws["alpha"], created_after=min(created.values()), created_before=newest + 1
        ) == [alpha_failed, alpha_done]
        # Across workspaces (other tests' batches on the shared server may be listed too).
        since = {"created_after": min(created.values())}
        everything = [b for b in await ids(ADMIN, limit=100, **since) if b in mine]
        assert sorted(everything) == sorted(mine)
        # Cursor pagination, one per page, in the same order as one page.
        pages: list[str] = []
        after: str | None = None
        for _ in range(200):
            params: dict[str, Any] = {"limit": 1, **since}
            if after:
                params["after"] = after
            r = await http.get("/api/v1/admin/batches", headers=stack.auth(ADMIN), params=params)
            page = r.json()
            pages += [b["id"] for b in page["data"]]
            if not page["has_more"]:
                break
            after = page["last_id"]
        assert [b for b in pages if b in mine] == everything
        assert len(set(pages)) == len(pages)
        # Bad filters and members.
        resp = await http.get(
            "/api/v1/admin/batches", headers=stack.auth(ADMIN), params={"status": "sleeping"}
        )
        assert_error(resp, 400, param="status")
        resp = await http.get("/api/v1/admin/batches", headers=stack.auth("sk-test-alpha"))
        assert_error(resp, 403, code="insufficient_role", type_="permission_error")
        # Files per workspace: metadata only, never another workspace's.
        r = await http.get(
            "/api/v1/admin/files", headers=stack.auth(AUDITOR), params={"workspace": ws["beta"]}
        )
        names = {f["filename"] for f in r.json()["data"]}
        assert "bad.jsonl" not in names and names, names
