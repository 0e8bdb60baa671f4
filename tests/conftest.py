"""Shared fixtures: one real Temporal dev server for the whole session, and a client for it.

    async def test_x(dev_server, temporal_client): ...
        dev_server.address        "127.0.0.1:<free port>"  (pass as TEMPORAL_ADDRESS)
        dev_server.port / .namespace / .server (the backfill.devserver.DevServer)
        await dev_server.client()  a new Client with the pydantic data converter
        temporal_client           a session-wide Client with the pydantic data converter

The server is headless, keeps its SQLite file in a temporary directory and has the search
attributes of backfill.batches.search_attributes.ALL registered.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import pytest_asyncio
from temporalio.client import Client

from tools.dev.devserver import DevServer, connect_client, free_port


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "scale: a test whose size is the subject (a memory or CPU-time bound, a page limit); "
        "make check leaves it out, make test runs it",
    )


SHORT_TIER = "tests/unit/"
"""The tier of many short tests: run last, so that they fill the processes' ends."""


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The long tiers (e2e, workflows, browser) first, the unit tests last, each in the order
    pytest-randomly gave it. pytest-xdist hands out modules in this order (`--dist loadfile`), so
    a long e2e module never starts last while the other processes sit idle: the suite's wall
    time is its work spread over the processes, not that plus the longest module."""
    items.sort(key=lambda item: item.nodeid.startswith(SHORT_TIER))


@dataclass(frozen=True)
class TemporalServer:
    address: str
    port: int
    namespace: str
    server: DevServer

    async def client(self) -> Client:
        return await connect_client(self.address, self.namespace)


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def dev_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[TemporalServer]:
    server = DevServer(tmp_path_factory.mktemp("temporal"), port=free_port(), ui_port=None)
    server.start()
    try:
        await server.wait_ready_async(timeout=60)
        yield TemporalServer(server.address, server.port, server.namespace, server)
    finally:
        await asyncio.to_thread(server.stop)


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def temporal_client(dev_server: TemporalServer) -> Client:
    return await dev_server.client()
