"""Upstream error bodies in OpenAI's envelope, request ids, and the api's bounded Temporal RPCs."""

from __future__ import annotations

import json
from datetime import timedelta

from temporalio.client import DescribeWorkflowInput

from api.live.proxy import _is_envelope, _wrap
from api.request_id import _ACCEPTED, new_request_id
from api.temporal_link import RPC_TIMEOUT, _with_deadline


def test_openai_envelope_is_recognised() -> None:
    assert _is_envelope(b'{"error": {"message": "bad", "type": "x", "param": null, "code": 400}}')
    assert not _is_envelope(b'{"object": "error", "message": "bad"}')
    assert not _is_envelope(b"Internal Server Error")
    assert not _is_envelope(b'{"error": "text"}')


def test_vllm_flat_error_keeps_its_fields() -> None:
    body = b'{"object": "error", "message": "too long", "type": "BadRequestError", "code": 400}'
    assert json.loads(_wrap(400, body)) == {
        "error": {"message": "too long", "type": "BadRequestError", "param": None, "code": 400}
    }


def test_anything_else_is_quoted_in_an_envelope() -> None:
    err = json.loads(_wrap(502, b"<html>bad gateway</html>"))["error"]
    assert err["message"] == "The model server answered 502: <html>bad gateway</html>"
    assert (err["type"], err["param"], err["code"]) == ("server_error", None, "upstream_error")
    assert json.loads(_wrap(404, b""))["error"]["type"] == "invalid_request_error"


def test_request_ids() -> None:
    rid = new_request_id()
    assert rid.startswith("req_") and _ACCEPTED.fullmatch(rid)
    assert _ACCEPTED.fullmatch("trace-1/abc:2")
    assert not _ACCEPTED.fullmatch("has space") and not _ACCEPTED.fullmatch("x" * 201)


def test_rpcs_get_a_deadline_unless_the_caller_set_one() -> None:
    def describe(timeout: timedelta | None) -> DescribeWorkflowInput:
        return DescribeWorkflowInput(id="w", run_id=None, rpc_metadata={}, rpc_timeout=timeout)

    assert _with_deadline(describe(None)).rpc_timeout == RPC_TIMEOUT
    assert _with_deadline(describe(timedelta(seconds=1))).rpc_timeout == timedelta(seconds=1)
