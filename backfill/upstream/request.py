"""The one way a request to a model server is built, for batch lines and live requests alike.

URL: the route's `base_url` and the endpoint's path. Headers: JSON content type, the request id
(`X-Request-ID`), `Accept-Encoding: identity` (batch lines cap the bytes on the wire; the live
proxy relays them byte for byte), and `Authorization: Bearer <key>` with the key read from the
route's `api_key_env` (never the client's gateway key, never logged).

Only the gateway sets `priority`: a client's own `priority` is dropped from every body (a vLLM
started with `--scheduling-policy priority` would otherwise let any member jump ahead of every
other tenant); batch lines of `vllm` routes then get the route's priority hint. The body policy
(`backfill.upstream.body_policy.outgoing_body`: `service_tier` on `openai` routes, `store` on the
Responses API) applies to every body.
"""

from __future__ import annotations

import json
import os
from typing import Any

import httpx

from backfill.platform import tracing
from backfill.platform.config import RouteConfig
from backfill.upstream.body_policy import outgoing_body
from backfill.upstream.endpoints import EndpointSpec

PRIORITY_FIELD = "priority"


def upstream_body(
    body: dict[str, Any], route: RouteConfig, hint: int | None = None, *, endpoint: str
) -> bytes:
    """`body` as sent upstream to `endpoint`: without the client's `priority`, with the route's
    priority hint when one is given and the route is a `vllm` one, and as the body policy lets
    it go (`outgoing_body`)."""
    body = outgoing_body(endpoint, body, route)
    if PRIORITY_FIELD in body:
        body = {k: v for k, v in body.items() if k != PRIORITY_FIELD}
    if hint is not None and route.provider == "vllm":
        body = {**body, PRIORITY_FIELD: hint}
    return json.dumps(body).encode()


def forwarded_body(
    raw: bytes, parsed: dict[str, Any], route: RouteConfig, *, endpoint: str
) -> bytes:
    """A live request body: as sent (byte for byte) unless it carries `priority` or the body
    policy changes it (the body is then written again from `parsed`, its decoding)."""
    if PRIORITY_FIELD in parsed or outgoing_body(endpoint, parsed, route) is not parsed:
        return upstream_body(parsed, route, endpoint=endpoint)
    return raw


def build_upstream_request(
    http: httpx.AsyncClient,
    route: RouteConfig,
    endpoint: EndpointSpec,
    body: bytes,
    request_id: str,
    *,
    timeout: httpx.Timeout,
    headers: dict[str, str] | None = None,
) -> httpx.Request:
    """A `POST` of `body` to `endpoint` on `route`. `headers` are added (e.g. `Accept`, the
    batch header); the ones set here win."""
    sent = dict(headers or {})
    sent.update(
        {
            "content-type": "application/json",
            "accept-encoding": "identity",
            "x-request-id": request_id,
        }
    )
    if route.api_key_env:
        key = os.environ.get(route.api_key_env)
        if key:
            sent["authorization"] = f"Bearer {key}"
    tracing.inject(sent)  # the current span's `traceparent`, when tracing is on
    url = route.base_url.rstrip("/") + endpoint.upstream_path
    return http.build_request("POST", url, content=body, headers=sent, timeout=timeout)
