from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.e2e.stack import SharedStacks, Stack, stop_moto

MakeStack = Callable[..., Awaitable[Stack]]


@pytest_asyncio.fixture(loop_scope="session")
async def stack(tmp_path: Path, dev_server: Any) -> AsyncIterator[Stack]:
    s = Stack(tmp_path, dev_server.address)
    async with s.running():
        yield s


@pytest_asyncio.fixture(loop_scope="session")
async def make_stack(tmp_path: Path, dev_server: Any) -> AsyncIterator[MakeStack]:
    """`await make_stack(workers=1, **Stack options)`: a started stack on the session's dev
    server, stopped after the test."""
    async with contextlib.AsyncExitStack() as stacks:
        made = 0

        async def make(workers: int = 1, **options: Any) -> Stack:
            nonlocal made
            made += 1
            tmp = tmp_path / f"stack{made}"
            tmp.mkdir()
            s = Stack(tmp, dev_server.address, **options)
            return await stacks.enter_async_context(s.running(workers))

        yield make


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def shared_stacks(
    tmp_path_factory: pytest.TempPathFactory, dev_server: Any
) -> AsyncIterator[SharedStacks]:
    """The session's shared stacks (tests/e2e/stack.py), stopped at its end."""
    stacks = SharedStacks(tmp_path_factory.mktemp("shared"), dev_server.address)
    try:
        yield stacks
    finally:
        await stacks.stop()


@pytest_asyncio.fixture(loop_scope="session")
async def shared_stack(shared_stacks: SharedStacks) -> AsyncIterator[Stack]:
    """A lease of the session's default stack (one worker): its own keys and workspaces, a
    simulator in its first state, its batches ended after the test. For a test that needs
    nothing of the stack but its own workspaces; `stack` when processes or the route's
    settings are the subject."""
    async with shared_stacks.lease() as s:
        yield s


@pytest_asyncio.fixture(loop_scope="session")
async def lease_stack(shared_stacks: SharedStacks) -> AsyncIterator[MakeStack]:
    """`await lease_stack(workers=1, **Stack options)`: a lease of the session's stack of those
    options (started by its first lease), ended after the test."""
    async with contextlib.AsyncExitStack() as leases:

        async def lease(workers: int = 1, **options: Any) -> Stack:
            return await leases.enter_async_context(shared_stacks.lease(workers, **options))

        yield lease


@pytest.fixture(scope="session", autouse=True)
def _moto_stopped_at_the_end() -> Iterator[None]:
    """The S3 runs' moto server (started by the first stack) stops with the session."""
    yield
    stop_moto()
