"""A single job's 202 names its model at once (issue 39: it answered `"model": null`, the model
being learnt by the batch's validation later)."""

from __future__ import annotations

import httpx

from tests.e2e.stack import Stack


async def test_the_202_of_a_job_shows_its_model(shared_stack: Stack) -> None:
    stack = shared_stack
    body = {"model": "demo", "messages": [{"role": "user", "content": "hi"}]}
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=60) as http:
        r = await http.post(
            "/gateway/v1/batches",
            json={"path": "/v1/chat/completions", "body": body},
            headers=stack.auth(),
        )
        assert r.status_code == 202, r.text
        assert r.json()["model"] == "demo"
