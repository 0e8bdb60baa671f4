"""Each workspace's share of the live proxy (`max_live_in_flight`), over real HTTP: the `openai`
SDK against the api, the simulator streaming slowly as upstream."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import openai
import pytest
import pytest_asyncio

from tests.conftest import TemporalServer
from tests.e2e.stack import Stack, assert_error, auth
from tests.polling import poll_until
from tools.sim import SimConfig

CAP = 2
MSG = [{"role": "user", "content": "one two three four five six seven eight"}]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def capped(
    tmp_path_factory: pytest.TempPathFactory,
    dev_server: TemporalServer,
) -> AsyncIterator[Stack]:
    # 60 ms per streamed event: a stream of 8 choices lasts about 5 s.
    sim = SimConfig(model_names=[], latency_ms=5, stream_token_delay_ms=60)
    tmp = tmp_path_factory.mktemp("live-limits")
    s = Stack(
        tmp, dev_server.address, sim=sim, workspace_limits={"alpha": {"max_live_in_flight": CAP}}
    )
    async with s.running():
        yield s


async def test_a_workspace_at_its_cap_gets_429_and_another_is_served(capped: Stack) -> None:
    alpha, beta = capped.client("sk-test-alpha"), capped.client("sk-test-beta")
    streams = [
        await alpha.chat.completions.create(
            model="demo",
            messages=MSG,  # type: ignore[arg-type]
            stream=True,
            n=8,
        )
        for _ in range(CAP)
    ]
    body = {"model": "demo", "messages": MSG}
    async with httpx.AsyncClient(base_url=capped.api_url) as http:
        # Alpha's CAP+1-th request at once: 429 at once, nothing sent upstream.
        seen = len(capped.sim.app.seen)
        resp = await http.post("/v1/chat/completions", json=body, headers=auth("sk-test-alpha"))
        err = assert_error(resp, 429, code="live_limit_exceeded", type_="rate_limit_error")
        assert f"limit is {CAP}" in err["message"]
        assert len(capped.sim.app.seen) == seen
        # Another workspace is served meanwhile.
        chat = await beta.chat.completions.create(model="demo", messages=MSG)  # type: ignore[arg-type]
        assert chat.choices[0].message.content
        # A client leaving mid-stream gives its slot back: alpha is served again.
        for stream in streams:
            await stream.close()

        async def alpha_served() -> int:
            r = await http.post("/v1/chat/completions", json=body, headers=auth("sk-test-alpha"))
            return r.status_code

        await poll_until(alpha_served, lambda s: s == 200, timeout=10, what="alpha served again")
    # The SDK turns the 429 into its RateLimitError (its own retries are off here).
    blocked = [
        await alpha.chat.completions.create(
            model="demo",
            messages=MSG,  # type: ignore[arg-type]
            stream=True,
            n=8,
        )
        for _ in range(CAP)
    ]
    try:
        await alpha.with_options(max_retries=0).chat.completions.create(
            model="demo",
            messages=MSG,  # type: ignore[arg-type]
        )
    except openai.RateLimitError as e:
        assert e.code == "live_limit_exceeded"
    else:
        raise AssertionError("alpha's request over its cap was served")
    finally:
        for stream in blocked:
            await stream.close()
