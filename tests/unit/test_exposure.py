"""What the api exposes, served as `backfill api` serves it (`api.main.server_config`: a real
uvicorn on loopback): `/metrics` only to platform_admin and auditor keys (and on a port of its
own when configured), no `/docs` page loading a CDN's scripts, the `Host` allow-list, and HSTS
plus `Secure` cookies over https, believed from `X-Forwarded-Proto` only from trusted proxies."""

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
from backfill.config import ApiKeyConfig, Settings, hash_key
from backfill.dev.procs import free_port

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
