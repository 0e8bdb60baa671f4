"""What the api exposes, served as `backfill api` serves it (`api.main.server_config`: a real
uvicorn on loopback): `/metrics` only to platform_admin and auditor keys (and on a port of its
own when configured), no `/docs` page loading a CDN's scripts, the `Host` allow-list, and HSTS
plus `Secure` cookies over https, believed from `X-Forwarded-Proto` only from trusted proxies;
and what it bounds against slow clients: the key checked before a body is read, connections at
once, idle keep-alive connections, header size."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from api.app import create_app
from api.main import server_config
from backfill.platform.config import ApiKeyConfig, Settings, hash_key
from tests.polling import poll_until
from tools.dev.procs import free_port

KEYS = {"sk-u-member": "member", "sk-u-admin": "platform_admin", "sk-u-auditor": "auditor"}

Serve = Callable[..., AbstractAsyncContextManager[str]]


@pytest.fixture
def serve(tmp_path: Path) -> Serve:
    @asynccontextmanager
    async def serving(**options: Any) -> AsyncIterator[str]:
        settings = Settings(
            data_dir=tmp_path,
            api_port=free_port(),
            api_keys=[
                ApiKeyConfig(sha256=hash_key(k), workspace="w", role=role, name=role)  # type: ignore[arg-type]
                for k, role in KEYS.items()
            ],
            **options,
        )
        app = create_app(settings, client=object())  # type: ignore[arg-type]
        server = uvicorn.Server(server_config(settings, app))
        task = asyncio.create_task(server.serve())
        try:
            while not server.started:
                assert not task.done(), "uvicorn did not start"
                await asyncio.sleep(0.01)
            yield f"http://127.0.0.1:{settings.api_port}"
        finally:
            server.should_exit = True
            await task

    return serving


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_metrics_need_an_admin_or_auditor_key(serve: Serve) -> None:
    async with serve() as url, httpx.AsyncClient(base_url=url) as http:
        assert (await http.get("/metrics")).status_code == 401
        resp = await http.get("/metrics", headers=bearer("sk-u-member"))
        assert resp.status_code == 403
        assert resp.json()["error"]["code"] == "insufficient_role"
        for key in ("sk-u-admin", "sk-u-auditor"):
            resp = await http.get("/metrics", headers=bearer(key))
            assert resp.status_code == 200 and "gateway_live_in_flight" in resp.text


def test_a_keyless_metrics_port_is_opt_in_and_on_loopback() -> None:
    settings = Settings()
    assert settings.api_metrics_port is None
    assert settings.api_metrics_host == "127.0.0.1"


async def test_no_swagger_page_but_the_schema(serve: Serve) -> None:
    async with serve() as url, httpx.AsyncClient(base_url=url) as http:
        assert (await http.get("/docs")).status_code == 404
        assert (await http.get("/redoc")).status_code == 404
        assert (await http.get("/openapi.json")).json()["info"]["title"] == "backfill"


async def test_on_loopback_only_loopback_host_names_are_answered(serve: Serve) -> None:
    """DNS rebinding: a page on evil.example whose name now resolves to 127.0.0.1 sends
    `Host: evil.example`; the dev api (public dev keys) must not answer it."""
    async with serve() as url, httpx.AsyncClient(base_url=url) as http:
        port = url.rsplit(":", 1)[1]
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"):
            assert (await http.get("/openapi.json", headers={"Host": host})).status_code == 200
        resp = await http.get("/openapi.json", headers={"Host": f"evil.example:{port}"})
        assert resp.status_code == 400


async def test_the_host_list_is_configurable(serve: Serve) -> None:
    async with (
        serve(api_allowed_hosts="gw.example.com, *.gw.example.com") as url,
        httpx.AsyncClient(base_url=url) as http,
    ):
        for host, status in (
            ("gw.example.com", 200),
            ("eu.gw.example.com", 200),
            ("127.0.0.1", 400),
            ("evil.example", 400),
        ):
            resp = await http.get("/openapi.json", headers={"Host": host})
            assert resp.status_code == status, host
    assert Settings(api_host="0.0.0.0").allowed_hosts() == ["*"]


async def test_https_through_a_trusted_proxy_gets_hsts_and_secure_cookies(serve: Serve) -> None:
    https = {"X-Forwarded-Proto": "https"}
    async with serve() as url, httpx.AsyncClient(base_url=url) as http:  # trusts 127.0.0.1
        plain = await http.get("/console/sign-in")
        assert "strict-transport-security" not in plain.headers
        assert "secure" not in plain.headers["set-cookie"].lower()
        tls = await http.get("/console/sign-in", headers=https)
        assert tls.headers["strict-transport-security"] == "max-age=31536000"
        assert "; secure" in tls.headers["set-cookie"].lower()
    # A proxy that is not trusted cannot claim https.
    async with (
        serve(forwarded_allow_ips="10.1.2.3") as url,
        httpx.AsyncClient(base_url=url) as http,
    ):
        resp = await http.get("/console/sign-in", headers=https)
        assert "strict-transport-security" not in resp.headers
        assert "secure" not in resp.headers["set-cookie"].lower()


# ---- slow and idle clients: what the process itself bounds -------------------------------------


async def raw_request(url: str, head: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(head)
    await writer.drain()
    return reader, writer


async def status_line(reader: asyncio.StreamReader, within: float = 5.0) -> bytes:
    return (await asyncio.wait_for(reader.readline(), within)).strip()


async def test_a_body_without_a_known_key_is_refused_before_any_of_it_is_read(
    serve: Serve,
) -> None:
    """A chunked body used to be read (up to 1 MiB) before the key was checked: a client that
    sends one chunk and stalls, without a key, must be answered 401 at once."""
    async with serve() as url:
        for auth_header in (b"", b"Authorization: Bearer sk-not-a-key\r\n"):
            reader, writer = await raw_request(
                url,
                b"POST /v1/batches HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                + auth_header
                + b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                + b'5\r\n{"a":\r\n',  # ... and never the rest
            )
            assert await status_line(reader) == b"HTTP/1.1 401 Unauthorized"
            writer.close()
        # A known key's body is read as before (here: an incomplete batch, 400).
        async with httpx.AsyncClient(base_url=url, headers=bearer("sk-u-member")) as http:
            resp = await http.post("/v1/batches", json={"endpoint": "/v1/chat/completions"})
            assert resp.status_code == 400


async def test_connections_past_the_limit_are_answered_503(serve: Serve) -> None:
    async with serve(api_max_concurrency=2) as url:
        idle = [await raw_request(url, b"") for _ in range(2)]  # connected, sending nothing
        async with httpx.AsyncClient(base_url=url) as http:
            assert (await http.get("/openapi.json")).status_code == 503
            for _, writer in idle:
                writer.close()
            for _, writer in idle:
                await writer.wait_closed()

            async def served() -> int:
                return (await http.get("/openapi.json")).status_code

            await poll_until(served, lambda s: s == 200, timeout=5, what="served again")


async def test_an_idle_keep_alive_connection_is_closed(serve: Serve) -> None:
    async with serve(api_keepalive_seconds=1) as url:
        reader, writer = await raw_request(
            url, b"GET /openapi.json HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        )
        assert await status_line(reader) == b"HTTP/1.1 200 OK"
        # The answer, then EOF once the connection was idle for 1 s (uvicorn's default: 5 s).
        rest = await asyncio.wait_for(reader.read(), 3.5)
        assert rest.endswith(b"}") and reader.at_eof()
        writer.close()


async def test_headers_past_the_bound_are_refused(serve: Serve) -> None:
    async with serve() as url:
        reader, writer = await raw_request(
            url, b"GET /openapi.json HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 17_000
        )
        assert (await status_line(reader)).startswith(b"HTTP/1.1 400")
        writer.close()
