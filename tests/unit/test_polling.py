"""The shared bounded wait fails naming what it waited for and the last value it saw."""

from __future__ import annotations

import itertools

import pytest

from tests.polling import PollTimeout, poll_until


async def test_returns_the_first_value_that_satisfies() -> None:
    counter = itertools.count()
    assert await poll_until(lambda: next(counter), lambda n: n >= 3, timeout=5, what="3") == 3


async def test_awaits_async_probes() -> None:
    async def probe() -> str:
        return "ok"

    assert await poll_until(probe, timeout=5, what="ok") == "ok"


async def test_times_out_naming_what_and_the_last_value() -> None:
    with pytest.raises(PollTimeout, match=r"waiting for the answer; last value: 41"):
        await poll_until(lambda: 41, lambda n: n == 42, timeout=0.2, what="the answer")


async def test_errors_fail_at_once_unless_ignored() -> None:
    def broken() -> int:
        raise ConnectionError("down")

    with pytest.raises(ConnectionError):
        await poll_until(broken, timeout=5, what="up")
    with pytest.raises(PollTimeout, match=r"last error: ConnectionError\('down'\)"):
        await poll_until(broken, timeout=0.2, what="up", ignore=(ConnectionError,))
