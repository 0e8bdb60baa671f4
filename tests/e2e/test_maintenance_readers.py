"""Every reader of a batch held by a route's maintenance hold sees the hold and its end (issue
48): the Batch object (`backfill.routes[].reason_detail` and the summary) on `GET` and in the
listing, the CLI's `get`, `list` and `watch`, and the console's batch page, all in one wording
(`backfill.routes.reasons.reason_text`), never "Queued — waiting for capacity"."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from typing import Any

import httpx

from backfill.routes.reasons import QUEUED_SUMMARY, WaitReason
from tests.e2e.conftest import MakeStack
from tests.e2e.stack import auth, jsonl
from tests.e2e.test_cli import Cli, cli
from tests.e2e.test_roles_matrix import SCHEDULING
from tests.polling import poll_until

ADMIN = "sk-test-admin"
TOKEN = re.compile(r'name="csrf_token" value="([^"]+)"')


async def test_every_reader_of_a_held_batch_sees_until_when(
    make_stack: MakeStack, tmp_path: Path
) -> None:
    stack = await make_stack()
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    end = now + dt.timedelta(hours=2)
    hold = {"start": (now - dt.timedelta(minutes=1)).isoformat(), "end": end.isoformat()}
    held = f"{WaitReason.MAINTENANCE} until {end.isoformat()}"
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=60) as http:
        url = SCHEDULING.format(route=stack.route_id)
        put = await http.put(url, headers=auth(ADMIN), json={"maintenance": hold})
        assert put.status_code == 200, put.text
        client = stack.client()
        f = await client.files.create(file=("in.jsonl", jsonl(3)), purpose="batch")
        batch = await client.batches.create(
            input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
        )

        def ext_of(b: Any) -> dict[str, Any]:
            return dict((b.model_extra or {})["backfill"])

        got = await poll_until(
            lambda: client.batches.retrieve(batch.id),
            lambda b: any(r.get("reason") for r in ext_of(b)["routes"]),
            timeout=60,
            what="the batch's route to say why its lines wait",
        )
        ext = ext_of(got)
        route = ext["routes"][0]
        assert route["reason"] == WaitReason.MAINTENANCE
        assert route["reason_detail"] == f"until {end.isoformat()}"
        assert ext["summary"] == held and ext["summary"] != QUEUED_SUMMARY
        listed = next(b for b in (await client.batches.list()).data if b.id == batch.id)
        assert ext_of(listed)["summary"] == held
        assert ext_of(listed)["routes"][0]["reason_detail"] == f"until {end.isoformat()}"

        # The CLI: `get`, `list` and `watch` say the hold with its end.
        rc, out = await cli(stack, "get", batch.id, cwd=tmp_path)
        assert rc == 0 and f"demo: {held}" in out, out
        rc, out = await cli(stack, "list", cwd=tmp_path)
        row = next(line for line in out.splitlines() if batch.id in line)
        assert rc == 0 and f"demo: {held}" in row, out
        watch = Cli(stack, ["watch", batch.id], tmp_path, tty=False)
        try:
            await watch.seen(re.escape(f"demo: {held}"), within=60)
        finally:
            watch.stop()

        # The console's batch page.
        console = httpx.AsyncClient(base_url=stack.api_url, timeout=60)
        async with console:
            form = await console.get("/console/sign-in")
            token = TOKEN.search(form.text)
            assert token is not None
            signed = await console.post(
                "/console/sign-in", data={"api_key": stack.key(), "csrf_token": token.group(1)}
            )
            assert signed.status_code == 303, signed.text
            page = await console.get(f"/console/batches/{batch.id}")
            assert page.status_code == 200, page.text
            assert held in page.text and QUEUED_SUMMARY not in page.text, page.text
        await client.batches.cancel(batch.id)
