"""The endpoint registry and what is derived from it; the one upstream request builder."""

from __future__ import annotations

import json
from typing import get_args

import httpx
import pytest

from api import app as api_app
from api.live import proxy
from backfill.batches import batch as batches
from backfill.platform.config import RouteConfig
from backfill.upstream.endpoints import REGISTRY, Endpoint
from backfill.upstream.request import build_upstream_request, forwarded_body, upstream_body


def test_the_batch_endpoints_are_the_registry_and_typed() -> None:
    assert set(get_args(Endpoint)) == set(REGISTRY) == set(batches.ENDPOINTS)
    assert batches.Endpoint is Endpoint


def test_the_live_routes_are_derived_from_the_registry() -> None:
    live = {p for p, spec in REGISTRY.items() if spec.live}
    assert api_app.LIVE_PATHS == live
    routed = {r.path for r in proxy.router.routes if "POST" in getattr(r, "methods", ())}
    assert routed == live


CHAT = "/v1/chat/completions"
ROUTE = RouteConfig(id="r1", base_url="http://upstream:8000/v1/", api_key_env="ROUTE_KEY")


def test_one_builder_for_url_headers_and_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROUTE_KEY", "sk-route")
    http = httpx.AsyncClient()
    req = build_upstream_request(
        http,
        ROUTE,
        REGISTRY["/v1/embeddings"],
        b"{}",
        "req_1",
        timeout=httpx.Timeout(1.0),
        headers={"accept": "text/event-stream", "authorization": "Bearer client-key"},
    )
    assert str(req.url) == "http://upstream:8000/v1/embeddings"
    assert req.headers["authorization"] == "Bearer sk-route"  # never the client's
    assert req.headers["x-request-id"] == "req_1"
    assert req.headers["accept-encoding"] == "identity"
    assert req.headers["content-type"] == "application/json"
    assert req.headers["accept"] == "text/event-stream"
    monkeypatch.delenv("ROUTE_KEY")
    req = build_upstream_request(
        http, ROUTE, REGISTRY["/v1/chat/completions"], b"{}", "r", timeout=httpx.Timeout(1.0)
    )
    assert "authorization" not in req.headers


def test_only_the_gateway_sets_priority() -> None:
    body = {"model": "m", "priority": -100, "messages": []}
    assert json.loads(upstream_body(body, ROUTE, endpoint=CHAT)) == {"model": "m", "messages": []}
    assert json.loads(upstream_body(body, ROUTE, 10, endpoint=CHAT))["priority"] == 10
    cloud = ROUTE.model_copy(update={"provider": "openai"})
    assert "priority" not in json.loads(upstream_body(body, cloud, 10, endpoint=CHAT))
    # A live body without `priority` goes on byte for byte; with one, rewritten without it.
    raw = b'{"model":  "m"}'
    assert forwarded_body(raw, {"model": "m"}, ROUTE, endpoint=CHAT) is raw
    assert json.loads(forwarded_body(b"...", body, ROUTE, endpoint=CHAT)) == {
        "model": "m",
        "messages": [],
    }


def test_responses_usage_is_read_with_its_details() -> None:
    from backfill.batches.records import usage_of

    u = {
        "input_tokens": 7,
        "input_tokens_details": {"cached_tokens": 2},
        "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 3},
        "total_tokens": 12,
    }
    spec = REGISTRY["/v1/responses"]
    for counts in (usage_of(u, spec.usage), usage_of(u)):  # by endpoint, or by its layout
        assert counts is not None
        assert (counts.input_tokens, counts.output_tokens, counts.total_tokens) == (7, 5, 12)
        assert (counts.cached_tokens, counts.reasoning_tokens) == (2, 3)
    chat = REGISTRY["/v1/chat/completions"].usage
    assert usage_of({"prompt_tokens": 1, "completion_tokens": 2}, chat) is not None
    assert usage_of(u, chat) is None  # not this endpoint's layout


def test_a_streamed_responses_usage_is_read_from_response_completed() -> None:
    from api.live.usage_counts import UsageReader

    reader = UsageReader("text/event-stream", REGISTRY["/v1/responses"].usage)
    usage = {"input_tokens": 4, "output_tokens": 6, "total_tokens": 10}
    reader.feed(b'event: response.created\ndata: {"type":"response.created","response":{}}\n\n')
    event = json.dumps({"type": "response.completed", "response": {"usage": usage}})
    reader.feed(b"event: response.completed\ndata: " + event.encode() + b"\n\n")
    assert reader.tokens() == (4, 6)
