"""The one way tests wait for observable state: bounded polling that fails with what it was
waiting for and the last value seen.

    batch = await poll_until(
        lambda: client.batches.retrieve(batch_id),
        lambda b: b.status == "completed",
        timeout=120,
        what=f"batch {batch_id} completed",
    )

`probe` is called (sync or async) every `interval` seconds; the first value for which `done`
is true (or that is truthy, without `done`) is returned. Past `timeout` a `PollTimeout` names
`what` and shows the last value (or the last exception the probe raised, when `ignore` lets the
probe fail while a service restarts).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")

_NOTHING = object()


class PollTimeout(AssertionError):
    """A polled condition did not hold within its time limit."""


async def _call(probe: Callable[[], Any]) -> Any:
    value = probe()
    if inspect.isawaitable(value):
        return await value
    return value


@overload
async def poll_until(
    probe: Callable[[], Awaitable[T]],
    done: Callable[[T], bool] | None = None,
    *,
    timeout: float,  # noqa: ASYNC109
    what: str,
    interval: float = 0.1,
    ignore: tuple[type[BaseException], ...] = (),
) -> T: ...


@overload
async def poll_until(
    probe: Callable[[], T],
    done: Callable[[T], bool] | None = None,
    *,
    timeout: float,  # noqa: ASYNC109
    what: str,
    interval: float = 0.1,
    ignore: tuple[type[BaseException], ...] = (),
) -> T: ...


async def poll_until(
    probe: Callable[[], Any],
    done: Callable[[Any], bool] | None = None,
    *,
    timeout: float,  # noqa: ASYNC109 (the limit is the point: it fails naming `what`)
    what: str,
    interval: float = 0.1,
    ignore: tuple[type[BaseException], ...] = (),
) -> Any:
    """Poll `probe` until `done(value)`; fail after `timeout` seconds naming `what`."""
    deadline = time.monotonic() + timeout
    last: Any = _NOTHING
    last_error: BaseException | None = None
    while True:
        try:
            last = await _call(probe)
            last_error = None
        except ignore as err:
            last_error = err
        else:
            if done(last) if done is not None else bool(last):
                return last
        if time.monotonic() >= deadline:
            seen = f"last error: {last_error!r}" if last_error else f"last value: {last!r}"
            raise PollTimeout(f"timed out after {timeout:.0f}s waiting for {what}; {seen}"[:4000])
        await asyncio.sleep(interval)
