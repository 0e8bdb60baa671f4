from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from tests.e2e.stack import Stack


@pytest_asyncio.fixture(loop_scope="session")
async def stack(tmp_path: Path, dev_server) -> AsyncIterator[Stack]:  # type: ignore[no-untyped-def]
    s = Stack(tmp_path, dev_server.address)
    async with s.running():
        yield s
