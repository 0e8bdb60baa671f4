"""Fixtures of the contract suite (tests/vllm/README.md): each test runs against every upstream.

    async def test_x(upstream): ...            the simulator, and vLLM when make test-vllm runs
    async def test_y(priority_upstream): ...   the same, started with the priority policy

Without BACKFILL_VLLM_VENV (plain `make test`) the contract tests run against the simulator only
and the gateway-against-vLLM tests are not collected. At most one vLLM runs at a time (2 cores):
asking for the other policy stops the running one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from tests.polling import poll_until
from tests.vllm.upstreams import Upstream, VllmProcess, running_sim, vllm_model, vllm_venv

VENV = vllm_venv()
UPSTREAMS = ["sim", "vllm"] if VENV is not None else ["sim"]

collect_ignore = [] if VENV is not None else ["test_gateway.py", "test_resume.py"]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "upstream_name" in metafunc.fixturenames:
        metafunc.parametrize("upstream_name", UPSTREAMS, scope="session")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests on the priority-policy server last (in their order), so vLLM restarts once."""
    items.sort(key=lambda item: "priority_upstream" in getattr(item, "fixturenames", ()))


class VllmPool:
    """One vLLM at a time, by scheduling policy."""

    def __init__(self, venv: Path, logs: Path) -> None:
        self.venv, self.logs = venv, logs
        self.current: VllmProcess | None = None

    async def get(self, policy: str) -> VllmProcess:
        if self.current is not None and self.current.policy == policy:
            return self.current
        self.close()
        log = self.logs / f"vllm-{policy}.log"
        server = VllmProcess(self.venv, vllm_model(self.venv), log, policy)
        server.start()
        self.current = server
        took = await server.wait_ready()
        print(f"\nvLLM ({policy}) up in {took:.0f} s on {server.url} (log {server.log})")
        return server

    def close(self) -> None:
        if self.current is not None:
            self.current.stop()
            self.current = None


@pytest_asyncio.fixture(scope="session")
async def vllm_pool(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[VllmPool | None]:
    """Starts nothing until asked; None without a vLLM venv."""
    if VENV is None:
        yield None
        return
    pool = VllmPool(VENV, tmp_path_factory.mktemp("vllm-logs"))
    try:
        yield pool
    finally:
        pool.close()


async def _upstream(name: str, policy: str, pool: VllmPool | None) -> AsyncIterator[Upstream]:
    if name == "sim":
        async with running_sim(policy) as up:
            yield up
        return
    assert pool is not None
    yield await idle_vllm(pool, policy)


async def idle_vllm(pool: VllmPool, policy: str) -> Upstream:
    """The shared vLLM, once idle: a test starts with no request of an earlier one in it (a
    closed stream's abort takes vLLM a moment), whatever order the tests run in."""
    server = await pool.get(policy)
    up = Upstream("vllm", server.url, policy)
    async with httpx.AsyncClient(timeout=60) as probe:
        await poll_until(
            lambda: up.load(probe),
            lambda load: load == (0, 0),
            timeout=60,
            what="vLLM idle before the test (an earlier test's requests still in it)",
            interval=0.1,
        )
    return up


@pytest_asyncio.fixture
async def upstream(upstream_name: str, vllm_pool: VllmPool | None) -> AsyncIterator[Upstream]:
    async for up in _upstream(upstream_name, "fcfs", vllm_pool):
        yield up


@pytest_asyncio.fixture
async def priority_upstream(
    upstream_name: str, vllm_pool: VllmPool | None
) -> AsyncIterator[Upstream]:
    async for up in _upstream(upstream_name, "priority", vllm_pool):
        yield up


@pytest_asyncio.fixture
async def vllm(vllm_pool: VllmPool | None) -> Upstream:
    """The shared vLLM (fcfs), idle: the gateway-against-vLLM tests' upstream."""
    assert vllm_pool is not None
    return await idle_vllm(vllm_pool, "fcfs")
