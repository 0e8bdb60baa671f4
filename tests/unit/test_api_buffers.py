"""The api's per-process buffer budgets (issue 47), through the real app with a mocked model
server: what one workspace's requests and answers hold cannot fail, truncate or stop the
accounting of another workspace's live requests.

- usage buffers (`api_usage_buffer_bytes`): an answer that does not fit is relayed whole and
  counts the request with 0 tokens; another workspace's answers still count theirs while the
  total has room;
- request bodies (`api_buffer_bytes`): a body that does not fit is answered 503
  `gateway_busy` with `Retry-After` before it is read; another workspace's is served."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from backfill.platform.config import ApiKeyConfig, Settings, hash_key
from backfill.usage.journal import UsageEntry

MiB = 1 << 20
ANSWER = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "z" * 300_000}}],
    "usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12},
}
ANSWER_BYTES = json.dumps(ANSWER).encode()
REQUEST = {"model": "demo", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[TestClient, list[UsageEntry]]]:
    settings = Settings.model_validate(
        {
            "data_dir": str(tmp_path),
            "models": [{"id": "demo", "routes": [{"id": "r", "base_url": "http://up/v1"}]}],
            "api_keys": [
                ApiKeyConfig(sha256=hash_key("sk-a"), workspace="a", name="a"),
                ApiKeyConfig(sha256=hash_key("sk-b"), workspace="b", name="b"),
            ],
            "api_usage_buffer_bytes": 1 * MiB,
            "api_usage_buffer_workspace_bytes": MiB // 2,
            "api_buffer_bytes": 64 * MiB,
            "api_buffer_workspace_bytes": 16 * MiB,
            "workspaces": {"default": {"max_stored_bytes": None}},
        }
    )
    app = create_app(settings, client=object())  # type: ignore[arg-type]

    async def answer(request: httpx.Request) -> httpx.Response:
        async def chunks() -> AsyncIterator[bytes]:
            for i in range(0, len(ANSWER_BYTES), 64 << 10):
                yield ANSWER_BYTES[i : i + (64 << 10)]

        headers = {"content-type": "application/json"}
        return httpx.Response(200, headers=headers, content=chunks())

    upstream = httpx.MockTransport(answer)
    with TestClient(app) as http:
        app.state.http = httpx.AsyncClient(transport=upstream)
        journaled: list[UsageEntry] = []
        app.state.usage.record = journaled.append
        yield http, journaled


def _chat(http: TestClient, key: str, **kw: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"}
    return http.post("/v1/chat/completions", json=REQUEST, headers=headers, **kw)


def _tokens(entry: UsageEntry) -> tuple[str, int, int]:
    return (entry.workspace, entry.prompt_tokens, entry.completion_tokens)


def test_a_workspace_over_its_usage_share_does_not_reach_another(
    api: tuple[TestClient, list[UsageEntry]],
) -> None:
    http, journaled = api
    budget = http.app.state.usage_buffers  # type: ignore[attr-defined]
    hog = budget.claim("a")
    assert hog.resize(MiB // 2)  # workspace a's unfinished answers hold its whole share

    for key in ("sk-a", "sk-b"):
        r = _chat(http, key)
        assert r.status_code == 200 and r.content == ANSWER_BYTES  # relayed whole either way
    assert [_tokens(e) for e in journaled] == [("a", 0, 0), ("b", 7, 5)]

    other = budget.claim("c")
    assert other.resize(MiB // 2)  # the process's whole budget is held now
    r = _chat(http, "sk-b")
    assert r.status_code == 200 and r.content == ANSWER_BYTES
    assert _tokens(journaled[-1]) == ("b", 0, 0)  # counted, without its tokens
    hog.release()
    other.release()
    assert budget.held == 0  # every finished answer gave its bytes back


def test_a_workspace_over_its_body_share_gets_503_and_another_is_served(
    api: tuple[TestClient, list[UsageEntry]],
) -> None:
    http, journaled = api
    middleware = http.app.middleware_stack  # type: ignore[attr-defined]
    while type(middleware).__name__ != "BodyLimit":
        middleware = middleware.app
    hog = middleware.budget.claim("a")
    assert hog.resize(16 * MiB - 10)  # workspace a's bodies in flight fill its share

    r = _chat(http, "sk-a")
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert r.json()["error"]["code"] == "gateway_busy"
    r = _chat(http, "sk-b")
    assert r.status_code == 200 and r.content == ANSWER_BYTES
    hog.release()
    r = _chat(http, "sk-a")
    assert r.status_code == 200 and r.content == ANSWER_BYTES
    assert middleware.budget.held == 0


def test_uploads_and_downloads_hold_their_buffers_in_their_workspaces_share(
    api: tuple[TestClient, list[UsageEntry]],
) -> None:
    """An upload holds its part buffer and chunk while it streams, a download its chunks in
    flight: refused (503) in a workspace whose share is full, served in another's."""
    http, _ = api
    budget = http.app.state.buffers  # type: ignore[attr-defined]
    line = json.dumps({"custom_id": "x", "method": "POST", "url": "/v1/chat/completions"})

    def upload(key: str) -> httpx.Response:
        return http.post(
            "/v1/files",
            files={"file": ("in.jsonl", line.encode() + b"\n")},
            data={"purpose": "batch"},
            headers={"Authorization": f"Bearer {key}"},
        )

    uploaded = {key: upload(key) for key in ("sk-a", "sk-b")}
    assert all(r.status_code == 200 for r in uploaded.values()), uploaded
    hog = budget.claim("a")
    assert hog.resize(16 * MiB - 10)
    refused = upload("sk-a")
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "gateway_busy"
    for key, status in (("sk-a", 503), ("sk-b", 200)):
        file_id = uploaded[key].json()["id"]
        r = http.get(f"/v1/files/{file_id}/content", headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == status, r.text
        if status == 200:
            assert r.content == line.encode() + b"\n"
        else:
            assert r.headers["retry-after"] == "1"
    assert upload("sk-b").status_code == 200
    hog.release()
    assert budget.held == 0
