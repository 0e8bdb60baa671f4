"""Record workflow histories for the replay tests (tests/workflows/test_replay.py).

    .venv/bin/python -m tests.workflows.record_histories            # every scenario not yet saved
    .venv/bin/python -m tests.workflows.record_histories batch_backoff ...   # only these

Histories are append-only. Each is saved as `<scenario>.<VERSION>.json` (the seven unversioned
files recorded before versioning are v1) and the recorder refuses to overwrite a file that
exists. A history that stops replaying is a running batch that would break: guard the change
with `workflow.patched` (or add a new workflow type), never re-record (docs/developing.md). To
add histories of the current code after such a change, bump VERSION: the old ones stay.

Each scenario drives the real stack (dev server, simulator, worker and api processes) through
one path, waits on observable state (never a fixed sleep), and checks that the history holds the
events the scenario is about before saving it. A continue-as-new chain saves every run.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
from temporalio.client import Client, WorkflowHistory
from temporalio.service import RPCError, RPCStatusCode

from backfill.platform.ids import scheduler_workflow_id
from backfill.platform.messages import LiveCountReport
from backfill.preemption.signing import sign
from tests.e2e.stack import API_KEY, Stack, submit, wait_terminal
from tests.e2e.test_preempt_door import live_streams
from tests.polling import poll_until
from tests.workflows.events import (
    E,
    activity_names,
    completed_result,
    find,
    patch_marker,
    require,
    signaled,
    updated,
)
from tools.dev.devserver import DevServer, connect_client, free_port
from tools.sim import SimConfig
from workflows.batch import BatchWorkflow
from workflows.patches import (
    ALARMS_ON_TIME,
    CONFIGURED_SETTINGS,
    DEADLINE_PACE_COUNTED,
    HELD_LINE_REQUEUED,
    REOPEN_RAMP,
    SEATS_HELD_BACK,
    WEBHOOK_EVENTS,
)

OUT = Path(__file__).parent / "histories"
VERSION = "v1"
"""Suffix of the histories this code records; bump it to record the current code again."""


def history_path(name: str, version: str = VERSION) -> Path:
    return OUT / f"{name}.{version}.json"


def recorded(name: str) -> bool:
    """Already saved in this version (an unversioned file of the same name counts as v1)."""
    legacy = VERSION == "v1" and (OUT / f"{name}.json").exists()
    return legacy or history_path(name).exists() or history_path(f"{name}.run01").exists()


def save(name: str, history: WorkflowHistory) -> None:
    """Write a new history file; an existing one is never rewritten."""
    path = history_path(name)
    with path.open("x") as f:  # FileExistsError instead of overwriting
        f.write(history.to_json())
    print(f"saved {path.name}: {len(history.events)} events")


# ---- the stack ---------------------------------------------------------------------------------


@asynccontextmanager
async def dev_stack(
    dynamic_config: dict[str, Any] | None = None, **stack_kw: Any
) -> AsyncIterator[tuple[Stack, Client]]:
    tmp = Path(tempfile.mkdtemp())
    server = DevServer(
        tmp / "t", port=free_port(), ui_port=None, dynamic_config=dynamic_config or {}
    )
    server.start()
    try:
        await server.wait_ready_async(timeout=60)
        stack = Stack(tmp, server.address, **stack_kw)
        async with stack.running():
            yield stack, await connect_client(server.address)
    finally:
        await asyncio.to_thread(server.stop)


async def running_lines(stack: Stack, batch_id: str) -> int:
    b = await stack.client().batches.retrieve(batch_id)
    return sum(r["running_lines"] for r in (b.model_extra or {})["backfill"]["routes"])


async def until(probe: Callable[[], Awaitable[Any]], done: Callable[[Any], bool], what: str) -> Any:
    return await poll_until(probe, done, timeout=120, what=what, interval=0.1)


# ---- scenarios on one stack (cap 2) ------------------------------------------------------------


async def batch_completed_paused(stack: Stack, temporal: Client) -> None:
    client = stack.client()
    done = await submit(stack, 30, prefix="done")
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {API_KEY}"}) as http:
        await until(lambda: running_lines(stack, done), lambda n: n > 0, "lines running")
        await http.post(f"{stack.api_url}/v1/batches/{done}/pause")
        await until(lambda: running_lines(stack, done), lambda n: n == 0, "the pause to drain")
        await http.post(f"{stack.api_url}/v1/batches/{done}/resume")
    await wait_terminal(client, done)
    h = await temporal.get_workflow_handle(done).fetch_history()
    require(h, E.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED, "pause signal", signaled("pause"))
    require(h, E.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED, "resume signal", signaled("resume"))
    save("batch_completed_paused", h)


async def batch_cancelled(stack: Stack, temporal: Client) -> None:
    client = stack.client()
    batch_id = await submit(stack, 200, prefix="cancel")
    await until(
        lambda: client.batches.retrieve(batch_id),
        lambda b: b.request_counts and b.request_counts.completed > 0,
        "progress",
    )  # noqa: E501
    await client.batches.cancel(batch_id)
    await wait_terminal(client, batch_id)
    h = await temporal.get_workflow_handle(batch_id).fetch_history()
    require(h, E.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED, "cancel_now", updated("cancel_now"))
    save("batch_cancelled", h)


async def batch_failed_validation(stack: Stack, temporal: Client) -> None:
    client = stack.client()
    bad = await client.files.create(file=("bad.jsonl", b"not json\n"), purpose="batch")
    failed = await client.batches.create(
        input_file_id=bad.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert (await wait_terminal(client, failed.id)).status == "failed"
    save("batch_failed_validation", await temporal.get_workflow_handle(failed.id).fetch_history())


async def batch_workflow_cancel_requested(stack: Stack, temporal: Client) -> None:
    """A Temporal cancellation request (UI Cancel button) while the batch waits, paused, with
    lines queued."""
    client = stack.client()
    batch_id = await submit(stack, 40, prefix="wfcx")
    await until(lambda: running_lines(stack, batch_id), lambda n: n > 0, "lines running")
    handle = temporal.get_workflow_handle_for(BatchWorkflow.run, batch_id)
    await handle.signal(BatchWorkflow.pause)
    await until(lambda: running_lines(stack, batch_id), lambda n: n == 0, "the pause to drain")
    await handle.cancel()
    b = await wait_terminal(client, batch_id)
    assert b.status == "cancelled" and b.request_counts.completed < 40, b
    h = await handle.fetch_history()
    require(h, E.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED, "cancellation request")
    require(h, E.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED, "completion (partial results kept)")
    save("batch_workflow_cancel_requested", h)


async def batch_cancel_while_validating(stack: Stack, temporal: Client) -> None:
    """The cancel signal arrives before validation ends (the workers are stopped meanwhile)."""
    client = stack.client()
    for w in stack.workers:
        await asyncio.to_thread(w.stop)
    batch_id = await submit(stack, 10, prefix="vcx")
    await temporal.get_workflow_handle_for(BatchWorkflow.run, batch_id).signal(BatchWorkflow.cancel)
    stack.start_worker()
    b = await wait_terminal(client, batch_id)
    assert b.status == "cancelled", b
    h = await temporal.get_workflow_handle(batch_id).fetch_history()
    cancel = require(h, E.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED, "cancel", signaled("cancel"))
    validated = require(h, E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED, "validation")
    assert cancel < validated, "the cancel came after validation"
    assert "run_line" not in activity_names(h), "a line ran"
    save("batch_cancel_while_validating", h)


async def batch_backoff(stack: Stack, temporal: Client) -> None:
    """Two 429s from the upstream: the lines are requeued and the route backs off (a timer)."""
    async with httpx.AsyncClient() as http:
        r = await http.post(
            f"{stack.sim.url}/sim/faults", json={"status": 429, "count": 2, "retry_after": 1}
        )
        assert r.status_code == 200, r.text
    batch_id = await submit(stack, 6, prefix="backoff")
    b = await wait_terminal(stack.client(), batch_id)
    assert b.status == "completed" and b.request_counts.completed == 6, b
    h = await temporal.get_workflow_handle(batch_id).fetch_history()
    retried = require(
        h,
        E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED,
        "line answered 'retry'",
        lambda e: (completed_result(e) or {}).get("retry") is True,
    )
    assert find(h, E.EVENT_TYPE_TIMER_STARTED, lambda e: True) >= 0
    assert any(e.event_type == E.EVENT_TYPE_TIMER_STARTED for e in h.events[retried:]), (
        "no back-off timer after the retry"
    )
    save("batch_backoff", h)


async def batch_paused_in_backoff(stack: Stack, temporal: Client) -> None:
    """Two 429s with a short Retry-After; the batch is paused while its lane backs off, stays
    paused until the back-off has passed, then resumes and completes. Under `alarms-on-time` the
    paused batch stops waiting on its back-off (runs from before it kept that deadline, and rang
    for it every millisecond once passed)."""
    scheduling = f"{stack.api_url}/api/v1/platform/deployments/{stack.route_id}/batch-scheduling"
    async with (
        httpx.AsyncClient(headers={"Authorization": f"Bearer {API_KEY}"}) as http,
        httpx.AsyncClient(headers={"Authorization": "Bearer sk-test-admin"}) as admin,
    ):
        r = await http.post(
            f"{stack.sim.url}/sim/faults", json={"status": 429, "count": 2, "retry_after": 3}
        )
        assert r.status_code == 200, r.text

        async def route_backoff() -> int | None:
            """The route's back-off end (the scheduler's, told by the batch once its lane has
            backed off), while it holds."""
            r = await admin.get(scheduling)
            assert r.status_code == 200, r.text
            until_: int | None = r.json()["status"]["backoff_until"]
            return until_

        batch_id = await submit(stack, 6, prefix="pausedbo")
        handle = temporal.get_workflow_handle(batch_id)
        await until(route_backoff, lambda t: t is not None, "the route to back off")
        r = await http.post(f"{stack.api_url}/v1/batches/{batch_id}/pause")
        assert r.status_code == 200, r.text

        def dropped_backoff(h: WorkflowHistory) -> bool:
            """The pause is in the history, and after it the patch marker: the paused batch
            asked `alarms-on-time` (its back-off still pending) and stopped waiting on it."""
            paused = find(h, E.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED, signaled("pause"))
            marker = find(h, E.EVENT_TYPE_MARKER_RECORDED, patch_marker(ALARMS_ON_TIME))
            return 0 <= paused < marker

        h = await until(handle.fetch_history, dropped_backoff, "the paused batch's patch marker")
        # The lane's back-off ends when its timer (the last one before the pause) would fire:
        # workflow time, i.e. the dev server's clock, which is this host's.
        paused = find(h, E.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED, signaled("pause"))
        timer = h.events[
            max(
                i
                for i, e in enumerate(h.events[:paused])
                if e.event_type == E.EVENT_TYPE_TIMER_STARTED
            )
        ]
        delay = timer.timer_started_event_attributes.start_to_fire_timeout.ToNanoseconds() / 1e9
        assert delay < 60, f"the last timer before the pause ({delay} s) is no back-off"
        ends = timer.event_time.ToNanoseconds() / 1e9 + delay
        await poll_until(time.time, lambda t: t > ends, timeout=120, what="the back-off's end")
        b = await stack.client().batches.retrieve(batch_id)
        assert b.status == "in_progress" and (b.model_extra or {})["backfill"]["paused"], b
        r = await http.post(f"{stack.api_url}/v1/batches/{batch_id}/resume")
        assert r.status_code == 200, r.text
    b = await wait_terminal(stack.client(), batch_id)
    assert b.status == "completed" and b.request_counts.completed == 6, b
    h = await handle.fetch_history()
    require(
        h,
        E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED,
        "line answered 'retry'",
        lambda e: (completed_result(e) or {}).get("retry") is True,
    )
    paused = require(h, E.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED, "pause signal", signaled("pause"))
    resumed = require(
        h, E.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED, "resume signal", signaled("resume")
    )
    marker = require(
        h, E.EVENT_TYPE_MARKER_RECORDED, f"{ALARMS_ON_TIME} marker", patch_marker(ALARMS_ON_TIME)
    )
    assert paused < marker < resumed, (paused, marker, resumed)
    assert h.events[resumed].event_time.ToNanoseconds() / 1e9 > ends, "resumed within back-off"
    save("batch_paused_in_backoff", h)


async def batch_line_lost(stack: Stack, temporal: Client) -> None:
    """The worker running lines is SIGKILLed: the lines' activities time out and are requeued."""
    stack.sim.app.config.latency_ms = 3000
    try:
        batch_id = await submit(stack, 4, prefix="lost")
        await until(
            lambda: stack.sim.app.stats_dict()["batch"]["by_batch"].get(batch_id, 0),
            lambda n: n > 0,
            "a line at the upstream",
        )
        stack.workers[-1].kill()
        stack.start_worker()
        b = await wait_terminal(stack.client(), batch_id)
    finally:
        stack.sim.app.config.latency_ms = 50
    assert b.status == "completed" and b.request_counts.completed == 4, b
    h = await temporal.get_workflow_handle(batch_id).fetch_history()
    require(h, E.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT, "lost line (activity timed out)")
    save("batch_line_lost", h)


async def batch_completed_announced(stack: Stack, temporal: Client) -> None:
    """A completed batch hands its webhook event over before it closes (patch webhook-events)."""
    batch_id = await submit(stack, 3, prefix="announced")
    assert (await wait_terminal(stack.client(), batch_id)).status == "completed"
    h = await temporal.get_workflow_handle(batch_id).fetch_history()
    require(h, E.EVENT_TYPE_MARKER_RECORDED, "webhook-events marker", patch_marker(WEBHOOK_EVENTS))
    assert "announce_webhook_event" in activity_names(h)
    save("batch_completed_announced", h)


async def batch_failed_announced(stack: Stack, temporal: Client) -> None:
    """A batch whose input validation rejects hands its `batch.failed` event over."""
    client = stack.client()
    bad = await client.files.create(file=("bad.jsonl", b"not json\n"), purpose="batch")
    failed = await client.batches.create(
        input_file_id=bad.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert (await wait_terminal(client, failed.id)).status == "failed"
    h = await temporal.get_workflow_handle(failed.id).fetch_history()
    require(h, E.EVENT_TYPE_MARKER_RECORDED, "webhook-events marker", patch_marker(WEBHOOK_EVENTS))
    assert "announce_webhook_event" in activity_names(h)
    save("batch_failed_announced", h)


async def batch_pace_counted(stack: Stack, temporal: Client) -> None:
    """A batch's demand carries its deadline and its lines' mean time, reported again once the
    first line finished and as the lines finished double (patch deadline-pace-counted)."""
    batch_id = await submit(stack, 12, prefix="paced")
    assert (await wait_terminal(stack.client(), batch_id)).status == "completed"
    h = await temporal.get_workflow_handle(batch_id).fetch_history()
    marker = patch_marker(DEADLINE_PACE_COUNTED)
    require(h, E.EVENT_TYPE_MARKER_RECORDED, "deadline-pace-counted marker", marker)
    save("batch_pace_counted", h)


async def route_scheduler_set_settings(stack: Stack, temporal: Client) -> None:
    url = f"{stack.api_url}/api/v1/platform/deployments/{stack.route_id}/batch-scheduling"
    async with httpx.AsyncClient(headers={"Authorization": "Bearer sk-test-admin"}) as http:
        assert (await http.put(url, json={"max_concurrent_lines": 3})).status_code == 200
    batch_id = await submit(stack, 6, prefix="settings")
    await wait_terminal(stack.client(), batch_id)
    h = await temporal.get_workflow_handle(scheduler_workflow_id(stack.route_id)).fetch_history()
    require(
        h, E.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED, "set_settings", updated("set_settings")
    )  # noqa: E501
    save("route_scheduler_set_settings", h)


async def route_scheduler_reopen_ramp(stack: Stack, temporal: Client) -> None:
    """The route's cap raised from 1 to 8 with the reopen ramp on: the scheduler hands the new
    slots out by doublings, each on a timer (patch reopen-ramp). The settings are put back."""
    url = f"{stack.api_url}/api/v1/platform/deployments/{stack.route_id}/batch-scheduling"
    ramp = {"initial": 1, "double_every_s": 0.5}
    async with httpx.AsyncClient(headers={"Authorization": "Bearer sk-test-admin"}) as http:
        r = await http.put(url, json={"max_concurrent_lines": 1, "reopen_ramp": ramp})
        assert r.status_code == 200, r.text
        batch_id = await submit(stack, 80, prefix="ramp")
        await until(lambda: running_lines(stack, batch_id), lambda n: n > 0, "lines running")
        r = await http.put(url, json={"max_concurrent_lines": 8, "reopen_ramp": ramp})
        assert r.status_code == 200, r.text
        assert r.json()["status"]["ramping_to"] == 8, r.json()
        await wait_terminal(stack.client(), batch_id)
        r = await http.put(url, json={"max_concurrent_lines": stack.cap})
        assert r.status_code == 200, r.text
    h = await temporal.get_workflow_handle(scheduler_workflow_id(stack.route_id)).fetch_history()
    marker = require(
        h, E.EVENT_TYPE_MARKER_RECORDED, f"{REOPEN_RAMP} marker", patch_marker(REOPEN_RAMP)
    )
    assert any(e.event_type == E.EVENT_TYPE_TIMER_STARTED for e in h.events[marker:]), (
        "no timer for a doubling after the ramp began"
    )
    save("route_scheduler_reopen_ramp", h)


async def route_scheduler_configured(stack: Stack, temporal: Client) -> None:
    """A worker restarted with a `settings` table for the route: its `configure` signal changes
    the scheduler's settings (patch configured-settings), then a batch runs under them. The
    file is put back and the worker restarted again, which drops what the table set."""
    handle = temporal.get_workflow_handle(scheduler_workflow_id(stack.route_id))
    # The first table starts the scheduler if no scenario did; the second one changes it.
    for table in ({"priority_hint": 7}, {"priority_hint": 9}, None):
        before = await configure_signals(handle)
        stack.route_settings = table
        stack.write_config()
        old = stack.workers[0]
        stack.start_worker()
        await until(
            lambda: configure_signals(handle),
            lambda n, before=before: n > before,
            "configure handled",
        )
        await asyncio.to_thread(old.stop)
        stack.workers.remove(old)
        if table is not None:
            await wait_terminal(stack.client(), await submit(stack, 4, prefix="configured"))
    h = await handle.fetch_history()
    require(
        h,
        E.EVENT_TYPE_MARKER_RECORDED,
        f"{CONFIGURED_SETTINGS} marker",
        patch_marker(CONFIGURED_SETTINGS),
    )
    save("route_scheduler_configured", h)


async def configure_signals(handle: Any) -> int:
    """`configure` signals a workflow task completed after, in the scheduler's history (0
    while it does not exist)."""
    try:
        events = (await handle.fetch_history()).events
    except RPCError as err:
        if err.status != RPCStatusCode.NOT_FOUND:
            raise
        return 0
    done = max(
        (i for i, e in enumerate(events) if e.event_type == E.EVENT_TYPE_WORKFLOW_TASK_COMPLETED),
        default=-1,
    )
    return sum(1 for e in events[: done + 1] if signaled("configure")(e))


async def route_scheduler(stack: Stack, temporal: Client) -> None:
    h = await temporal.get_workflow_handle(scheduler_workflow_id(stack.route_id)).fetch_history()
    require(h, E.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED, "demand", signaled("demand"))
    save("route_scheduler", h)


ONE_STACK: dict[str, Callable[[Stack, Client], Awaitable[None]]] = {
    f.__name__: f
    for f in (
        batch_completed_paused,
        batch_cancelled,
        batch_failed_validation,
        batch_workflow_cancel_requested,
        batch_cancel_while_validating,
        batch_backoff,
        batch_paused_in_backoff,
        batch_line_lost,
        batch_completed_announced,
        batch_failed_announced,
        batch_pace_counted,
        route_scheduler_set_settings,
        route_scheduler_reopen_ramp,
        route_scheduler_configured,
        route_scheduler,  # last: after the others' traffic
    )
}


async def one_stack(names: Iterable[str]) -> None:
    names = list(names)
    if not names:
        return
    async with dev_stack(cap=2, sim=SimConfig(model_names=[], latency_ms=50)) as (stack, t):
        for name in names:
            await ONE_STACK[name](stack, t)


# ---- continue-as-new chains (every run) --------------------------------------------------------


async def continued_as_new() -> None:
    """A batch and a scheduler that continue as new several times; every run is saved, so the
    replay covers runs that start from carried-over state, not only first runs."""
    async with dev_stack(
        {"limit.historyCount.suggestContinueAsNew": 60},
        cap=1,
        sim=SimConfig(model_names=[], latency_ms=60),
    ) as (stack, temporal):
        # Three workspaces contend for one slot: shares rotate, so the scheduler's history grows.
        batch_id = await submit(stack, 60, prefix="can")
        others = [
            (key, await submit(stack, 60, key=key, prefix=key[-5:]))
            for key in ("sk-test-beta", "sk-test-gamma")
        ]
        for key, b in [("sk-test-alpha", batch_id), *others]:
            await wait_terminal(stack.client(key), b)
        for name, wf_id in (
            ("batch_continue_as_new_chain", batch_id),
            ("route_scheduler_continue_as_new_chain", scheduler_workflow_id(stack.route_id)),
        ):
            runs = sorted(
                [ex async for ex in temporal.list_workflows(f"WorkflowId = '{wf_id}'")],
                key=lambda ex: ex.start_time,
            )
            assert len(runs) > 2, f"{wf_id} continued as new only {len(runs) - 1} times"
            for i, ex in enumerate(runs, start=1):
                h = await temporal.get_workflow_handle(wf_id, run_id=ex.run_id).fetch_history()
                if i < len(runs):
                    require(h, E.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW, "continue-as-new")
                save(f"{name}.run{i:02d}", h)


async def held_back() -> None:
    """Preemptive yield holding lines back (patches held-line-requeued and seats-held-back).

    1. An api process the route's scheduler never heard from (this recorder, on the worker's
       real channel) fills every shared seat: the lines the scheduler allots wait at the
       worker's door until its limit, and come back `held`.
    2. Live streams whose time to first token is over a 1 ms target: the worker holds both
       shared seats back and tells the scheduler, whose allotment drops to 0."""
    token = "record-preempt-" + "r" * 32
    async with dev_stack(
        cap=2, sim=SimConfig(model_names=[], latency_ms=300), preempt_token=token
    ) as (stack, temporal):
        admin = {"Authorization": "Bearer sk-test-admin"}
        url = f"{stack.api_url}/api/v1/platform/deployments/{stack.route_id}/batch-scheduling"
        channel = f"http://127.0.0.1:{stack.worker_metrics_ports[0]}/preempt/live"
        seats = {"seats": 3, "keep_free": 1}
        async with httpx.AsyncClient(timeout=10) as http:
            r = await http.put(
                url,
                json={"max_concurrent_lines": 2, "seat_aware": seats, "preempt": {}},
                headers=admin,
            )
            assert r.status_code == 200, r.text
            batch_id = await submit(stack, 4, prefix="door")

            async def fill_every_seat() -> None:
                while True:
                    report = LiveCountReport(
                        route=stack.route_id,
                        process="recorder",
                        live=2,
                    )
                    body = report.model_dump_json().encode()
                    await http.post(
                        channel, content=body, headers=sign(token, "/preempt/live", body)
                    )
                    await asyncio.sleep(1)

            async def held_outcome() -> bool:
                h = await temporal.get_workflow_handle(batch_id).fetch_history()
                return (
                    find(
                        h,
                        E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED,
                        lambda e: (completed_result(e) or {}).get("held") is True,
                    )
                    >= 0
                )

            filler = asyncio.ensure_future(fill_every_seat())
            try:
                await until(held_outcome, bool, "a line back from the door, held")
            finally:
                filler.cancel()
            assert (await wait_terminal(stack.client(), batch_id)).status == "completed"
            h = await temporal.get_workflow_handle(batch_id).fetch_history()
            require(
                h, E.EVENT_TYPE_MARKER_RECORDED, "held marker", patch_marker(HELD_LINE_REQUEUED)
            )
            if not recorded("batch_held_at_door"):
                save("batch_held_at_door", h)

            r = await http.put(
                url,
                json={
                    "max_concurrent_lines": 2,
                    "seat_aware": seats,
                    "preempt": {"live_ttft_target_ms": 1},
                },
                headers=admin,
            )
            assert r.status_code == 200, r.text
            client = stack.client()

            batch_id = await submit(stack, 6, prefix="heldback")
            live = asyncio.ensure_future(live_streams(client))
            try:
                await until(
                    lambda: http.get(url, headers=admin),
                    lambda r: (
                        r.json()["status"]["seats_held_back"] == 2
                        and [b["allotment"] for b in r.json()["status"]["batches"]] == [0]
                    ),
                    "the scheduler leaving the 2 held-back seats out",
                )
            finally:
                live.cancel()
            assert (await wait_terminal(client, batch_id)).status == "completed"
        scheduler = temporal.get_workflow_handle(scheduler_workflow_id(stack.route_id))
        h = await scheduler.fetch_history()
        require(h, E.EVENT_TYPE_MARKER_RECORDED, "held-back marker", patch_marker(SEATS_HELD_BACK))
        if not recorded("route_scheduler_held_back"):
            save("route_scheduler_held_back", h)


def expiry() -> None:
    """From the time-skipping test, which saves it when BACKFILL_RECORD_HISTORIES is set."""
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "tests/workflows/test_expiry.py", "-k", "24h"],
        check=True,
        env={**os.environ, "BACKFILL_RECORD_HISTORIES": history_path("batch_expired").name},
    )


def deadline() -> None:
    """From the time-skipping test of deadline-aware shares, which saves the scheduler's first
    run when BACKFILL_RECORD_HISTORIES is set."""
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "tests/workflows/test_deadline_shares.py"],
        check=True,
        env={
            **os.environ,
            "BACKFILL_RECORD_HISTORIES": history_path("route_scheduler_deadline").name,
        },
    )


def store_failed() -> None:
    """From the time-skipping test of a permanent store error at finalizing (patch
    store-outage-waits), which saves it when BACKFILL_RECORD_HISTORIES is set."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "tests/workflows/test_store_outage.py",
            "-k",
            "cannot_mend",
        ],
        check=True,
        env={**os.environ, "BACKFILL_RECORD_HISTORIES": history_path("batch_store_failed").name},
    )


SCENARIOS = [
    *ONE_STACK,
    "batch_continue_as_new_chain",
    "batch_expired",
    "batch_held_at_door",
    "route_scheduler_held_back",
    "route_scheduler_deadline",
    "batch_store_failed",
]


def main(argv: list[str]) -> None:
    unknown = set(argv) - set(SCENARIOS)
    if unknown:
        raise SystemExit(f"unknown scenarios {sorted(unknown)}; known: {SCENARIOS}")
    if argv:
        existing = [n for n in argv if recorded(n)]
        if existing:
            raise SystemExit(f"already recorded in {VERSION} (never re-record): {existing}")
    wanted = argv or [n for n in SCENARIOS if not recorded(n)]
    print(f"recording {wanted or 'nothing: every scenario is recorded in ' + VERSION}")
    asyncio.run(one_stack(n for n in wanted if n in ONE_STACK))
    if "batch_continue_as_new_chain" in wanted:
        asyncio.run(continued_as_new())
    if "batch_expired" in wanted:
        expiry()
    if {"batch_held_at_door", "route_scheduler_held_back"} & set(wanted):
        asyncio.run(held_back())
    if "route_scheduler_deadline" in wanted:
        deadline()
    if "batch_store_failed" in wanted:
        store_failed()


if __name__ == "__main__":
    main(sys.argv[1:])
