"""The body policy (issue 40, decision 0028): the Responses API's `background`, `store`,
`previous_response_id` and `conversation` refused unless a route allows them, `store: false`
sent upstream, `service_tier` dropped on `openai` routes; for batch lines at validation and on
the wire, and for live requests."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from backfill.batches.input_rules import validate_input
from backfill.platform.config import ModelConfig, RouteConfig, Settings
from backfill.upstream.body_policy import outgoing_body, refused_field
from backfill.upstream.request import forwarded_body, upstream_body

RESPONSES, CHAT = "/v1/responses", "/v1/chat/completions"
VLLM = RouteConfig(id="r1", base_url="http://127.0.0.1:1/v1")
CLOUD = RouteConfig(id="c1", base_url="https://api.example.com/v1", provider="openai")
OWN = VLLM.model_copy(
    update={"allow_body_fields": ["background", "store", "previous_response_id", "conversation"]}
)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("background", True),
        ("background", "true"),
        ("background", 1),
        ("store", True),
        ("previous_response_id", "resp_abc"),
        ("conversation", {"id": "conv_1"}),
    ],
)
def test_fields_that_escape_scheduling_are_refused(field: str, value: Any) -> None:
    body = {"model": "m", "input": "hi", field: value}
    assert refused_field(RESPONSES, body, VLLM) == field
    assert refused_field(RESPONSES, body, CLOUD) == field
    assert refused_field(RESPONSES, body, OWN) is None  # the route allows it


@pytest.mark.parametrize(
    "body",
    [
        {"background": False},
        {"store": False},
        {"previous_response_id": None},
        {"background": None, "store": 0},
    ],
)
def test_off_values_pass(body: dict[str, Any]) -> None:
    assert refused_field(RESPONSES, {"model": "m", "input": "x", **body}, VLLM) is None


def test_other_endpoints_are_not_judged_by_the_responses_fields() -> None:
    assert refused_field(CHAT, {"model": "m", "store": True, "background": True}, VLLM) is None


def test_store_goes_upstream_off_and_service_tier_is_dropped_on_openai_routes() -> None:
    responses = {"model": "m", "input": "hi", "service_tier": "priority"}
    assert json.loads(upstream_body(responses, VLLM, endpoint=RESPONSES)) == {
        **responses,
        "store": False,
    }
    assert json.loads(upstream_body(responses, CLOUD, endpoint=RESPONSES)) == {
        "model": "m",
        "input": "hi",
        "store": False,
    }
    chat = {"model": "m", "messages": [], "service_tier": "flex"}
    assert json.loads(upstream_body(chat, CLOUD, endpoint=CHAT)) == {"model": "m", "messages": []}
    assert json.loads(upstream_body(chat, VLLM, endpoint=CHAT)) == chat  # vLLM bills no one
    allowed = CLOUD.model_copy(update={"allow_body_fields": ["service_tier", "store"]})
    assert outgoing_body(CHAT, chat, allowed) is chat
    assert outgoing_body(RESPONSES, responses, allowed) is responses


def test_a_live_body_is_rewritten_only_when_the_policy_changes_it() -> None:
    raw = b'{"model": "m", "input": "hi", "store": false}'
    parsed = json.loads(raw)
    assert forwarded_body(raw, parsed, VLLM, endpoint=RESPONSES) is raw
    raw = b'{"model": "m", "input": "hi"}'
    sent = forwarded_body(raw, json.loads(raw), VLLM, endpoint=RESPONSES)
    assert json.loads(sent) == {"model": "m", "input": "hi", "store": False}
    raw = b'{"model": "m", "messages": [], "service_tier": "priority"}'
    assert "service_tier" not in json.loads(
        forwarded_body(raw, json.loads(raw), CLOUD, endpoint=CHAT)
    )


def _line(custom_id: str, **body: Any) -> bytes:
    line = {
        "custom_id": custom_id,
        "method": "POST",
        "url": RESPONSES,
        "body": {"model": "demo", "input": "hi", **body},
    }
    return json.dumps(line).encode() + b"\n"


def test_a_batch_line_with_background_fails_validation_unless_its_route_allows_it() -> None:
    data = _line("a") + _line("b", background=True) + _line("c", previous_response_id="resp_x")
    settings = Settings(models=[ModelConfig(id="demo", routes=[VLLM])])
    out = validate_input(
        io.BytesIO(data), batch_id="b", endpoint=RESPONSES, settings=settings, max_errors=10
    )
    assert [(e.line, e.code, e.param) for e in out.errors] == [
        (2, "invalid_body", "body.background"),
        (3, "invalid_body", "body.previous_response_id"),
    ]
    assert "scheduling" in out.errors[0].message
    settings = Settings(models=[ModelConfig(id="demo", routes=[OWN])])
    out = validate_input(io.BytesIO(data), batch_id="b", endpoint=RESPONSES, settings=settings)
    assert out.errors == [] and len(out.offsets) == 3


DUPLICATED = b'{"model":"demo","input":"hi","background":true,"background":false}'
"""`background` twice: the gateway's checks read the last value, a server may act on the first."""


def test_a_live_body_with_a_key_twice_is_refused(tmp_path: Any) -> None:
    """400 before anything is sent (the route's address answers nothing)."""
    from fastapi.testclient import TestClient

    from api.app import create_app
    from backfill.platform.config import ApiKeyConfig, hash_key

    settings = Settings(
        data_dir=tmp_path,
        models=[ModelConfig(id="demo", routes=[VLLM])],
        api_keys=[ApiKeyConfig(sha256=hash_key("sk-d"), workspace="w", name="w")],
    )
    app = create_app(settings, client=object())  # type: ignore[arg-type]
    headers = {"Authorization": "Bearer sk-d", "Content-Type": "application/json"}
    with TestClient(app, headers=headers) as http:
        r = http.post(RESPONSES, content=DUPLICATED)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and "'background'" in err["message"]


def test_a_batch_line_with_a_key_twice_fails_validation() -> None:
    line = b'{"custom_id":"a","method":"POST","url":"/v1/responses","body":' + DUPLICATED + b"}\n"
    settings = Settings(models=[ModelConfig(id="demo", routes=[VLLM])])
    out = validate_input(io.BytesIO(line), batch_id="b", endpoint=RESPONSES, settings=settings)
    assert [(e.line, e.code) for e in out.errors] == [(1, "invalid_json_line")]
    assert "'background' appears more than once" in out.errors[0].message
