"""Bounded requests on the real api: a body over its limit is refused with 413 in OpenAI's
envelope before the key is even looked at; uploads get the file cap."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx

from tests.conftest import TemporalServer
from tests.e2e.stack import Stack, assert_error


async def test_an_oversized_json_body_is_refused_before_authentication(
    shared_stack: Stack,
) -> None:
    stack = shared_stack
    big = b'{"input_file_id": "' + b"x" * (2 << 20) + b'"}'
    async with httpx.AsyncClient(base_url=stack.api_url) as http:
        no_key = await http.post("/v1/batches", content=big)
        assert_error(no_key, 413, code="request_too_large")
        for path in ("/v1/batches", "/api/v1/platform/deployments/x/batch-scheduling"):
            resp = await http.request(
                "PUT" if "platform" in path else "POST", path, content=big, headers=stack.auth()
            )
            assert_error(resp, 413, code="request_too_large")
        small = await http.post("/v1/batches", json={"input_file_id": 5}, headers=stack.auth())
        assert small.status_code == 400  # under the limit: parsed and answered as usual


def form(parts: list[tuple[bytes, bytes]], boundary: bytes = b"lim1t") -> bytes:
    out = b""
    for headers, value in parts:
        out += b"--" + boundary + b"\r\n" + headers + b"\r\n\r\n" + value + b"\r\n"
    return out + b"--" + boundary + b"--\r\n"


FORM_TYPE = {"Content-Type": "multipart/form-data; boundary=lim1t"}
FILE_PART = (b'Content-Disposition: form-data; name="file"; filename="a.jsonl"', b"{}\n")
PURPOSE = (b'Content-Disposition: form-data; name="purpose"', b"batch")


async def test_an_upload_form_with_too_many_parts_or_header_bytes_is_refused(
    shared_stack: Stack,
) -> None:
    stack = shared_stack
    form_headers = {**stack.auth(), **FORM_TYPE}
    many = [(f'Content-Disposition: form-data; name="f{i}"'.encode(), b"x") for i in range(40)]
    long_header = (b'Content-Disposition: form-data; name="purpose"; x="' + b"h" * 9000 + b'"', b"")
    async with httpx.AsyncClient(base_url=stack.api_url) as http:
        resp = await http.post("/v1/files", content=form(many + [FILE_PART]), headers=form_headers)
        assert "parts" in assert_error(resp, 400)["message"]
        resp = await http.post(
            "/v1/files", content=form([long_header, FILE_PART]), headers=form_headers
        )
        assert "headers" in assert_error(resp, 400)["message"]
        ok = await http.post("/v1/files", content=form([PURPOSE, FILE_PART]), headers=form_headers)
        assert ok.status_code == 200, ok.text


async def test_a_chunked_upload_past_the_request_limit_is_refused_while_streaming(
    tmp_path: Path, dev_server: TemporalServer
) -> None:
    async with Stack(tmp_path, dev_server.address, limits={"max_file_bytes": 1000}).running() as s:

        async def body() -> AsyncIterator[bytes]:
            yield form([PURPOSE, FILE_PART])
            for _ in range(3):  # after the closing boundary: only the request limit bounds it
                yield b"e" * (1 << 20)

        async with httpx.AsyncClient(base_url=s.api_url) as http:
            resp = await http.post("/v1/files", content=body(), headers={**s.auth(), **FORM_TYPE})
            assert_error(resp, 413, param="file", code="file_too_large")
            assert s.store().keys("files/") == []
