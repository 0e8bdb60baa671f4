"""The api's outer middleware, served by a real uvicorn on loopback: oversized bodies are refused
before any route or key check runs, and an unexpected error answers 500 in OpenAI's envelope
without dropping the client's keep-alive connection."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest_asyncio
from fastapi import FastAPI, Request

from api.middleware import BodyLimit, BodyRule, CatchAll
from tools.sim import SimServer

LIMIT = 1000


def make_app(seen: list[str]) -> FastAPI:
    app = FastAPI()

    @app.post("/echo")
    async def echo(request: Request) -> dict[str, int]:
        seen.append("echo")  # the route (and so any auth dependency) ran
        return {"bytes": len(await request.body())}

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("bug")

    @app.get("/ok")
    async def ok() -> dict[str, bool]:
        return {"ok": True}

    app.add_middleware(CatchAll)
    app.add_middleware(BodyLimit, rule_for=lambda method, path: BodyRule(LIMIT))
    return app


@pytest_asyncio.fixture(loop_scope="session")
async def served() -> AsyncIterator[tuple[str, list[str]]]:
    seen: list[str] = []
    server = SimServer()
    server.app = make_app(seen)  # type: ignore[assignment]
    await server.start()
    try:
        yield server.url, seen
    finally:
        await server.stop()


def assert_envelope(resp: httpx.Response, status: int, code: str | None) -> None:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == code


async def test_a_declared_oversized_body_is_refused_before_the_route_runs(
    served: tuple[str, list[str]],
) -> None:
    url, seen = served
    async with httpx.AsyncClient() as http:
        resp = await http.post(f"{url}/echo", content=b"x" * (LIMIT + 1))
        assert_envelope(resp, 413, "request_too_large")
        assert seen == []
        assert (await http.post(f"{url}/echo", content=b"x" * LIMIT)).json() == {"bytes": LIMIT}


async def test_a_chunked_oversized_body_is_refused_and_a_small_one_replayed(
    served: tuple[str, list[str]],
) -> None:
    url, seen = served
    seen.clear()

    async def chunks(n: int) -> AsyncIterator[bytes]:
        for _ in range(n):
            yield b"y" * 300

    async with httpx.AsyncClient() as http:
        resp = await http.post(f"{url}/echo", content=chunks(4))  # 1200 bytes, no length
        assert_envelope(resp, 413, "request_too_large")
        assert seen == []
        assert (await http.post(f"{url}/echo", content=chunks(3))).json() == {"bytes": 900}


async def test_an_unexpected_error_is_a_500_envelope_and_the_connection_survives(
    served: tuple[str, list[str]],
) -> None:
    url, _ = served
    limits = httpx.Limits(max_connections=1)
    async with httpx.AsyncClient(limits=limits) as http:
        resp = await http.get(f"{url}/boom")
        assert_envelope(resp, 500, None)
        assert resp.headers.get("connection") != "close"
        pool = http._transport._pool  # type: ignore[attr-defined]
        conn = pool.connections[0]
        again = await http.get(f"{url}/ok")
        assert again.json() == {"ok": True}
        assert pool.connections == [conn]  # the same connection served both
