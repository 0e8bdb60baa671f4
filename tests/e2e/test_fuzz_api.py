"""Property: whatever a client sends to any route of the api (random JSON bodies, mutated valid
bodies, query parameters, path values, keys and multipart shapes), no answer is a 5xx and every
4xx carries OpenAI's error envelope. The routes are the FastAPI app's own, so a new route is
fuzzed too."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest_asyncio
from fastapi.routing import APIRoute
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.app import create_app
from backfill.platform.config import Settings
from tests.e2e.stack import KEYS, Stack, jsonl, submit
from tools.sim import SimConfig

EXAMPLES = 150


def api_routes(routes: list[Any]) -> Iterator[tuple[str, str]]:
    """(method, path) of every endpoint, through included routers."""
    for route in routes:
        if isinstance(route, APIRoute):
            for method in sorted(route.methods):
                yield method, route.path
        elif hasattr(route, "original_router"):
            yield from api_routes(route.original_router.routes)


ROUTES = sorted(set(api_routes(create_app(Settings()).routes)))
PARAM = re.compile(r"\{(\w+)(?::\w+)?\}")
SCHEDULING = "/api/v1/platform/deployments/{route_id}/batch-scheduling"

json_scalar = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30)
json_value = st.recursive(
    json_scalar,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)
FIELDS = [
    "input_file_id",
    "endpoint",
    "completion_window",
    "metadata",
    "output_expires_after",
    "model",
    "messages",
    "prompt",
    "input",
    "stream",
    "max_tokens",
    "max_concurrent_lines",
    "server_load",
    "priority_hint",
    "time_window",
    "yield_to_live_traffic",
    "purpose",
]
QUERY_NAMES = ["after", "limit", "purpose", "order", "workspace", "status", "model", "before"]
text = st.text(max_size=40)


def templates(ids: dict[str, list[str]], sim_url: str) -> dict[str, dict[str, Any]]:
    """A valid body per route: the fuzzer mutates these to get past the first check."""
    return {
        "/v1/batches": {
            "input_file_id": ids["file"][0],
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
            "metadata": {"k": "v"},
            "output_expires_after": {"anchor": "created_at", "seconds": 3600},
        },
        "/v1/chat/completions": {
            "model": "demo",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 5,
        },
        "/v1/completions": {"model": "demo", "prompt": "hi", "max_tokens": 5},
        "/v1/embeddings": {"model": "demo", "input": "hi"},
        SCHEDULING: {
            "max_concurrent_lines": 2,
            "yield_to_live_traffic": {"pause_at_in_flight": 3},
            "server_load": {"metrics_url": f"{sim_url}/metrics", "max_waiting": 4},
            "time_window": {
                "time_zone": "UTC",
                "days": ["mon", "tue"],
                "from": "00:00",
                "until": "23:59",
            },
        },
    }


@st.composite
def mutated(draw: st.DrawFn, template: dict[str, Any]) -> dict[str, Any]:
    """The template with some keys dropped, some values replaced (also one level deep), some
    added."""
    body = {k: v for k, v in template.items() if draw(st.integers(0, 3))}
    for key in draw(st.lists(st.sampled_from([*template, *FIELDS]), max_size=3)):
        old = body.get(key)
        if isinstance(old, dict) and old and draw(st.booleans()):
            inner = dict(old)
            inner[draw(st.sampled_from(list(old)))] = draw(json_value)
            body[key] = inner
        else:
            body[key] = draw(json_value)
    return body


@st.composite
def bodies(draw: st.DrawFn, template: dict[str, Any] | None) -> dict[str, Any]:
    """Keyword arguments for httpx: a JSON body (a mutated valid one, or random), raw bytes,
    or nothing."""
    kinds = ["json", "raw", "none"] + ["template"] * (4 if template is not None else 0)
    kind = draw(st.sampled_from(kinds))
    json_type = {"content-type": "application/json"}
    if kind == "template":
        # NaN and Infinity go out as Python's json writes them: not JSON, the api must say so.
        return {"content": json.dumps(draw(mutated(template or {}))), "headers": json_type}
    if kind == "json":
        return {"content": json.dumps(draw(json_value)), "headers": json_type}
    if kind == "raw":
        ctype = draw(st.sampled_from(["application/json", "text/plain", "multipart/form-data"]))
        return {"content": draw(st.binary(max_size=200)), "headers": {"content-type": ctype}}
    return {}


@st.composite
def multipart(draw: st.DrawFn) -> dict[str, Any]:
    """A form of random parts: files (random name, bytes, or a JSONL batch input) and fields."""
    names = st.sampled_from(
        ["file", "file", "purpose", "expires_after[anchor]", "expires_after[seconds]"]
    )
    files: list[tuple[str, Any]] = []
    for _ in range(draw(st.integers(0, 4))):
        name = draw(names | text)
        if draw(st.booleans()):
            content = draw(st.binary(max_size=300) | st.just(jsonl(2)))
            ctype = draw(st.sampled_from(["application/jsonl", "application/octet-stream", ""]))
            files.append((name, (draw(text), content, ctype)))
        else:
            value = draw(
                st.sampled_from(["batch", "fine-tune", "user_data", "created_at", "3600"]) | text
            )
            files.append((name, (None, value)))
    return {"files": files} if files else {}


def path_value(name: str, ids: dict[str, list[str]]) -> st.SearchStrategy[str]:
    known = {
        "file_id": ids["file"],
        "batch_id": ids["batch"],
        "route_id": ids["route"],
        "model_id": ["demo"],
    }
    return st.sampled_from(known.get(name, ["x"]) * 3) | st.text(min_size=1, max_size=30)


@st.composite
def requests(
    draw: st.DrawFn, ids: dict[str, list[str]], valid: dict[str, dict[str, Any]]
) -> tuple[str, str, dict[str, Any]]:
    method, template = draw(st.sampled_from(ROUTES))
    path = PARAM.sub(lambda m: quote(draw(path_value(m.group(1), ids)), safe=""), template)
    params = draw(
        st.dictionaries(
            st.sampled_from(QUERY_NAMES) | text,
            text | st.integers().map(str) | st.sampled_from(ids["batch"] + ids["file"]),
            max_size=3,
        )
    )
    # Mostly a key allowed to use the route, so the fuzzing reaches past authorization.
    fitting = "sk-test-admin" if template.startswith("/api/") else "sk-test-alpha"
    key = draw(st.sampled_from([fitting] * 6 + [*KEYS, "sk-wrong", None]))
    kwargs: dict[str, Any] = {"params": params}
    if method in ("POST", "PUT", "PATCH"):
        if template == "/v1/files" and draw(st.booleans()):
            kwargs |= draw(multipart())
        else:
            kwargs |= draw(bodies(valid.get(template)))
    headers = dict(kwargs.pop("headers", {}))
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    kwargs["headers"] = headers
    return method, path, kwargs


def check(method: str, path: str, resp: httpx.Response) -> None:
    where = f"{method} {path} → {resp.status_code}: {resp.text[:300]}"
    assert resp.status_code < 500, where
    if path.startswith("/console") and not resp.headers.get("content-type", "").startswith(
        "application/json"
    ):  # the web console answers people with HTML pages (or a redirect to sign in); a body
        # that cannot be parsed at all gets the API's JSON envelope, checked below
        assert resp.is_redirect or resp.headers["content-type"].startswith("text/html"), where
        return
    if 400 <= resp.status_code < 500:
        body = resp.json()
        assert set(body) == {"error"}, where
        err = body["error"]
        assert set(err) == {"message", "type", "param", "code"}, where
        assert isinstance(err["message"], str) and err["message"], where
        assert isinstance(err["type"], str) and err["type"], where


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def fuzz_stack(tmp_path_factory, dev_server) -> AsyncIterator[Stack]:  # type: ignore[no-untyped-def]
    s = Stack(tmp_path_factory.mktemp("fuzz"), dev_server.address, sim=SimConfig(model_names=[]))
    async with s.running():
        yield s


async def test_no_request_gets_a_5xx_and_every_4xx_is_an_envelope(fuzz_stack: Stack) -> None:
    stack = fuzz_stack
    batch_id = await submit(stack, 2)
    file_id = (await stack.client().files.create(file=("in.jsonl", jsonl(2)), purpose="batch")).id
    ids = {"file": [file_id], "batch": [batch_id], "route": [stack.route_id]}
    valid = templates(ids, stack.sim.base_url)

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
    @given(req=requests(ids, valid))
    def fuzz(req: tuple[str, str, dict[str, Any]]) -> None:
        method, path, kwargs = req
        with httpx.Client(base_url=stack.api_url, timeout=30) as http:
            resp = http.request(method, path, **kwargs)
        check(method, path, resp)

    await asyncio.to_thread(fuzz)
