from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.e2e.stack import Stack, stop_moto

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


@pytest.fixture(scope="session", autouse=True)
def _moto_stopped_at_the_end() -> Iterator[None]:
    """The S3 runs' moto server (started by the first stack) stops with the session."""
    yield
    stop_moto()
