"""Bounded requests on the real api: a body over its limit is refused with 413 in OpenAI's
envelope before the key is even looked at; uploads get the file cap."""

from __future__ import annotations

import httpx

from tests.e2e.stack import Stack, assert_error, auth


async def test_an_oversized_json_body_is_refused_before_authentication(stack: Stack) -> None:
    big = b'{"input_file_id": "' + b"x" * (2 << 20) + b'"}'
    async with httpx.AsyncClient(base_url=stack.api_url) as http:
        no_key = await http.post("/v1/batches", content=big)
        assert_error(no_key, 413, code="request_too_large")
        for path in ("/v1/batches", "/api/v1/platform/deployments/x/batch-scheduling"):
            resp = await http.request(
                "PUT" if "platform" in path else "POST", path, content=big, headers=auth()
            )
            assert_error(resp, 413, code="request_too_large")
        small = await http.post("/v1/batches", json={"input_file_id": 5}, headers=auth())
        assert small.status_code == 400  # under the limit: parsed and answered as usual
