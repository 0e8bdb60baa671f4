"""The driver the preemption tests against vLLM share (test_gateway.py, test_resume.py): a stack
with its route on the shared vLLM, lines sized to the CPU's speed now, live streams that take a
batch line's seat, and bounded waits on what the gateway and vLLM report.

vLLM on CPU runs at whatever speed the machine has now (a loaded 2-core machine is several times
slower than an idle one), so nothing here assumes a duration: lines are sized from a measured
pace, and every wait polls for a state with a generous limit, never a time."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.stack import TERMINAL, auth
from tests.e2e.test_live_gates import ADMIN, put_settings
from tests.polling import poll_until
from tests.vllm.upstreams import LONG_TOKENS, Upstream, VllmStack, long_body

MODEL = "demo"
"""The stack's model id; vLLM serves the tiny model under it too (`--served-model-name`)."""

__all__ = [
    "MODEL",
    "cancel",
    "counted",
    "counter",
    "live_stream",
    "put_settings",
    "scheduling",
    "tokens_for",
    "vllm_stack",
    "wait_ended",
    "wait_preempted",
]

T = TypeVar("T")


@contextlib.asynccontextmanager
async def vllm_stack(
    tmp_path: Path, dev_server: Any, vllm: Upstream, **options: Any
) -> AsyncIterator[VllmStack]:
    stack = VllmStack(tmp_path, dev_server.address, vllm_url=vllm.url, **options)
    async with stack.running():
        yield stack


async def scheduling(stack: VllmStack, http: httpx.AsyncClient) -> dict[str, Any] | None:
    """The route's scheduling status, or None while the endpoint answers its documented 503
    `temporal_unavailable` (the scheduler's query unanswered in time: "Workflow is busy" on a
    loaded machine, seen in a clean-clone run); any other answer fails."""
    url = f"{stack.api_url}/api/v1/platform/deployments/{stack.route_id}/batch-scheduling"
    # A connection of its own each time: on a loaded machine more than the api's keep-alive
    # (uvicorn's 5 s) can pass between two polls, and a kept-alive connection the api closes as
    # it is reused fails the read ("Server disconnected without sending a response", seen here).
    resp = await http.get(url, headers={**auth(ADMIN), "Connection": "close"})
    if resp.status_code == 503 and resp.json()["error"]["code"] == "temporal_unavailable":
        return None
    assert resp.status_code == 200, resp.text
    return resp.json()  # type: ignore[no-any-return]


def temporal_unavailable(err: openai.APIStatusError) -> bool:
    """The api's documented 503 `temporal_unavailable`: a Temporal call of the request ran out of
    time (on a loaded 2-core machine a batch read's query and its fallback to Temporal's record
    both did, seen in this machine's runs), and the request may be made again."""
    return err.status_code == 503 and err.code == "temporal_unavailable"


async def unless_unavailable(call: Callable[[], Awaitable[T]]) -> T | None:
    """`call()`'s answer, or None while the api answers 503 `temporal_unavailable`; any other
    error fails."""
    try:
        return await call()
    except openai.InternalServerError as err:
        if not temporal_unavailable(err):
            raise
        return None


async def wait_ended(client: openai.AsyncOpenAI, batch_id: str, within: float) -> Any:
    """The batch once it reached a terminal status, read again while the api answers 503
    `temporal_unavailable` (tests/e2e/stack.py's `wait_terminal` fails at any error)."""
    found = await poll_until(
        lambda: unless_unavailable(lambda: client.batches.retrieve(batch_id)),
        lambda b: b is not None and b.status in TERMINAL,
        timeout=within,
        what=f"batch {batch_id} to reach a terminal status",
        interval=0.25,
    )
    assert found is not None
    return found


async def cancel(client: openai.AsyncOpenAI, batch_id: str, within: float = 120) -> None:
    """Cancel the batch, asking again while the api answers 503 `temporal_unavailable`. Such an
    answer may come after the cancel went through, so once one came, a 409 (the batch already
    cancelling or ended) ends the asking too."""
    unanswered = False

    async def attempt() -> bool:
        nonlocal unanswered
        try:
            await client.batches.cancel(batch_id)
        except openai.ConflictError:
            if not unanswered:
                raise
        except openai.InternalServerError as err:
            if not temporal_unavailable(err):
                raise
            unanswered = True
            return False
        return True

    await poll_until(attempt, timeout=within, what=f"batch {batch_id} cancelled", interval=1.0)


async def wait_preempted(
    stack: VllmStack, http: httpx.AsyncClient, at_least: int, within: float = 180
) -> dict[str, Any]:
    """The route's status once it counts `at_least` preempted line runs (batches on it now).
    Within 180 s: the status answers 503 while the scheduler's query goes unanswered, and in a
    CI run it did for the whole of an earlier 60 s."""
    found = await poll_until(
        lambda: scheduling(stack, http),
        lambda d: d is not None and d["status"]["preempted_lines"] >= at_least,
        timeout=within,
        what=f"{at_least} batch line run(s) preempted for live traffic",
        interval=0.2,
    )
    assert found is not None
    return found["status"]  # type: ignore[no-any-return]


async def tokens_for(vllm: Upstream, http: httpx.AsyncClient, seconds: float) -> int:
    """How many tokens vLLM makes in about `seconds` for one sequence, measured now (the faster of
    two samples, so a moment's load elsewhere does not make the lines short): the same count lasts
    a second on an idle fast CPU and a minute on a loaded slow one."""
    sample = 128
    took = []
    for _ in range(2):
        started = time.monotonic()
        r = await http.post(
            f"{vllm.base_url}/chat/completions",
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": "pace"}],
                "max_tokens": sample,
                "ignore_eos": True,
            },
        )
        took.append(time.monotonic() - started)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == sample, r.json()["usage"]
    return min(LONG_TOKENS, max(sample, round(sample * seconds / min(took))))


async def counter(vllm: Upstream, http: httpx.AsyncClient, name: str) -> float:
    """A counter of vLLM's `/metrics` (`vllm:generation_tokens`, `vllm:prompt_tokens`: every
    request's tokens so far), summed over its labels."""
    resp = await http.get(f"{vllm.url}/metrics", headers={"Connection": "close"})
    for family in text_string_to_metric_families(resp.text):
        if family.name == name:
            return sum(s.value for s in family.samples if s.name.endswith("_total"))
    raise AssertionError(f"vLLM's /metrics has no {name}_total")


async def counted(
    vllm: Upstream, http: httpx.AsyncClient, name: str, at_least: float, what: str
) -> float:
    """`counter(name)` once it reaches `at_least` (within 120 s)."""
    return await poll_until(
        lambda: counter(vllm, http, name),
        lambda n: n >= at_least,
        timeout=120,
        what=what,
        interval=0.2,
    )


@contextlib.asynccontextmanager
async def live_stream(client: openai.AsyncOpenAI) -> AsyncIterator[None]:
    """One long live stream in flight through the gateway at a time while inside (each ended
    by leaving: the client closes it and vLLM aborts it)."""

    async def streams() -> None:
        while True:
            stream = await client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "live"}],
                stream=True,
                extra_body=long_body(),
            )
            async for _ in stream:
                pass

    live = asyncio.ensure_future(streams())
    try:
        yield
    finally:
        live.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await live
