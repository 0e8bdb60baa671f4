"""A one-machine cluster (issue 47 item 6): two api processes and three workers on one task
queue, the file store on S3 (moto's server), preemptive yield's channel with the workers found
on the task queue, live streams through both apis, and a worker and an api SIGKILLed mid-batch.
Every line is answered exactly once, none fails, lines are preempted, and every worker was
reached by both apis.

Always on S3 (not marked `store`: it needs no second run on it), whatever `BACKFILL_TEST_STORE`
says."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from functools import partial
from pathlib import Path

import httpx
import openai

from tests.conftest import TemporalServer
from tests.e2e.crash import kill_and_time_recovery
from tests.e2e.stack import (
    Stack,
    input_ids,
    moto_server,
    output_ids,
    submit,
    wait_terminal,
)
from tests.e2e.test_live_gates import batch_arrivals, put_settings, scheduling, worker_samples
from tests.polling import poll_until
from tools.dev.devserver import connect_client
from tools.dev.procs import Child, backfill_argv, free_port
from tools.sim import SimConfig

WORKERS = 3
LINES = 30
SEATS = 3


async def live_streams(client: openai.AsyncOpenAI) -> int:
    """One live stream at a time through `client`'s api until it is gone (or cancelled): how
    many completed."""
    done = 0
    while True:
        try:
            stream = await client.chat.completions.create(
                model="demo", messages=[{"role": "user", "content": "live"}], stream=True
            )
            async for _ in stream:
                pass
        except openai.APIConnectionError:
            return done
        done += 1


async def start_second_api(stack: Stack, http: httpx.AsyncClient) -> tuple[Child, str]:
    """Another api process of the stack (same config, store, Temporal), healthy; its URL."""
    api = Child("api2")
    port = free_port()
    env = {**stack.env(), "BACKFILL_API_PORT": str(port)}
    api.start(backfill_argv("api"), env, stack.tmp / "api2.log")
    url = f"http://127.0.0.1:{port}"

    async def healthy() -> bool:
        if not api.running:
            raise RuntimeError(f"the second api exited: {api.log_tail()}")
        resp = await http.get(f"{url}/healthz")
        return resp.status_code == 200 and resp.json()["status"] == "ok"

    await poll_until(
        healthy, timeout=60, what="the second api healthy", interval=0.2, ignore=(httpx.HTTPError,)
    )
    return api, url


async def test_two_apis_three_workers_on_s3_survive_kills_and_preempt(
    tmp_path: Path, dev_server: TemporalServer
) -> None:
    sim = SimConfig(model_names=[], latency_ms=1500, stream_token_delay_ms=100)
    stack = Stack(
        tmp_path,
        dev_server.address,
        cap=SEATS,
        sim=sim,
        preempt_token=secrets.token_urlsafe(48),
        # Lines through the task queue, so the three workers share them.
        extra_env={"BACKFILL_WORKER_EAGER_ACTIVITIES": "0"},
    )
    stack.s3_url = moto_server().url  # S3 whatever the run's store
    async with stack.running(workers=WORKERS), httpx.AsyncClient(timeout=30) as http:
        api2, api2_url = await start_second_api(stack, http)
        second = openai.AsyncOpenAI(api_key=stack.key(), base_url=f"{api2_url}/v1", max_retries=0)
        lives: list[asyncio.Future[int]] = []
        try:
            await put_settings(
                stack,
                http,
                {
                    "max_concurrent_lines": SEATS,
                    "seat_aware": {"seats": SEATS, "keep_free": 0},
                    "preempt": {"max_preemptions": 100},
                },
            )
            for i in range(WORKERS):  # each found by both apis, and by the other workers
                await poll_until(
                    partial(worker_samples, stack, "gateway_preempt_reporting_processes", i),
                    lambda s: s.get(stack.route_id, 0) >= 2,
                    timeout=60,
                    what=f"worker {i} hearing both apis' live counts",
                    interval=0.2,
                )
                await poll_until(
                    partial(worker_samples, stack, "gateway_preempt_peer_workers", i),
                    lambda s: s.get("", 0) == WORKERS - 1,
                    timeout=30,
                    what=f"worker {i} finding the other two",
                    interval=0.2,
                )
            for url in (stack.api_url, api2_url):  # each api reaches every worker
                resp = await http.get(
                    f"{url}/api/v1/platform/deployments/{stack.route_id}/batch-scheduling",
                    headers=stack.auth("sk-test-admin"),
                )
                channel = resp.json()["status"]["preempt_channel"]
                assert channel == {"workers_found": WORKERS, "workers_reached": WORKERS}, url

            client = stack.client()
            batch_id = await submit(stack, LINES, prefix="cluster")
            await poll_until(
                lambda: len(batch_arrivals(stack)),
                lambda n: n >= SEATS,
                timeout=60,
                what="every seat taken by batch lines",
            )
            lives = [asyncio.ensure_future(live_streams(c)) for c in (stack.client(), second)]
            await poll_until(
                lambda: scheduling(stack, http),
                lambda d: d["status"]["preempted_lines"] > 0,
                timeout=30,
                what="batch lines preempted for the live streams",
                interval=0.2,
            )
            temporal = await connect_client(stack.temporal_address)
            recovery = await kill_and_time_recovery(temporal, batch_id, stack.workers, "busiest")
            api2.kill()  # its live stream ends with it; the other api carries on
            assert await asyncio.wait_for(lives[1], timeout=30) >= 0
            batch = await wait_terminal(client, batch_id, within=180)
        finally:
            for live in lives:
                live.cancel()
                with contextlib.suppress(asyncio.CancelledError, openai.APIError):
                    await live
            api2.kill()
        assert batch.status == "completed", batch
        ids, errors = await output_ids(client, batch)
        assert errors == []
        assert ids == input_ids("cluster", LINES)  # each exactly once, in input order
        assert batch.request_counts is not None
        assert (batch.request_counts.completed, batch.request_counts.failed) == (LINES, 0)
        assert recovery.lost_lines >= 1  # the killed worker had lines running
        assert batch.model_extra is not None  # the batch counts its lines preempted
        [route] = batch.model_extra["backfill"]["routes"]
        assert route["preempted_lines"] > 0
        keys = await asyncio.to_thread(stack.store().keys, f"batches/{batch_id}/")
        assert keys == [f"batches/{batch_id}/finalized.json"]  # its work dropped from S3
