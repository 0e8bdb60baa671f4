"""A worker stopped with SIGTERM (systemd stop, a rolling upgrade, Kubernetes) lets its running
lines finish before it exits: nothing is aborted upstream, sent twice, or counted as lost.

Evidence comes from three independent places: the simulator (requests per batch, aborted
requests), the batch's Temporal history (which worker started and completed each `run_line`,
and no timed-out, failed or cancelled one), and the batch's output file."""

from __future__ import annotations

import signal
import socket
from datetime import UTC, datetime
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent

from tests.e2e.conftest import MakeStack
from tests.e2e.stack import Stack, input_ids, output_ids, submit, wait_in_flight, wait_terminal
from tests.polling import poll_until
from tools.dev.devserver import connect_client
from tools.dev.procs import Child
from tools.sim import SimConfig

SLOW = SimConfig(model_names=[], latency_ms=3000)
"""Lines that take 3 s upstream: long enough to be in flight when the signal arrives."""
CLOSED_BADLY = {
    EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT,
    EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED,
    EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED,
}


def identity(worker: Child) -> str:
    """The Temporal identity of a worker process (the SDK's default: pid@host)."""
    return f"{worker.pid}@{socket.gethostname()}"


async def history(stack: Stack, batch_id: str) -> list[HistoryEvent]:
    """Every event of the batch workflow, across its continued-as-new runs, oldest first."""
    temporal = await connect_client(stack.temporal_address)
    runs: list[list[HistoryEvent]] = []
    run_id: str | None = None
    while True:
        handle = temporal.get_workflow_handle(batch_id, run_id=run_id)
        events = [e async for e in handle.fetch_history_events()]
        runs.insert(0, events)
        started = events[0].workflow_execution_started_event_attributes
        if not started.continued_execution_run_id:
            return [e for run in runs for e in run]
        run_id = started.continued_execution_run_id


def run_line_activities(events: list[HistoryEvent]) -> list[dict[str, Any]]:
    """One dict per `run_line` activity: who started it, how it closed, who closed it, when."""
    by_scheduled: dict[tuple[int, int], dict[str, Any]] = {}
    run = 0  # event ids restart with each run
    for e in events:
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
            run += 1
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = e.activity_task_scheduled_event_attributes
            if attrs.activity_type.name == "run_line":
                by_scheduled[(run, e.event_id)] = {"closed": None}
            continue
        for field in (
            "activity_task_started_event_attributes",
            "activity_task_completed_event_attributes",
            "activity_task_failed_event_attributes",
            "activity_task_timed_out_event_attributes",
            "activity_task_canceled_event_attributes",
        ):
            if e.HasField(field):
                attrs = getattr(e, field)
                act = by_scheduled.get((run, attrs.scheduled_event_id))
                if act is None:
                    break
                if field == "activity_task_started_event_attributes":
                    act["started_by"] = attrs.identity
                    act["started_at"] = e.event_time.ToDatetime(UTC)
                else:
                    act["closed"] = e.event_type
                    act["closed_by"] = getattr(attrs, "identity", None)
                    act["closed_at"] = e.event_time.ToDatetime(UTC)
                break
    return list(by_scheduled.values())


async def assert_nothing_lost(stack: Stack, batch_id: str, n: int) -> list[dict[str, Any]]:
    """The batch completed every line once: output, upstream requests and history agree."""
    client = stack.client()
    batch = await wait_terminal(client, batch_id, within=240)
    assert batch.status == "completed", batch
    ids, errors = await output_ids(client, batch)
    assert errors == []  # no line_lost, no cancelled or failed line
    assert ids == input_ids("req", n)
    assert batch.request_counts.completed == n and batch.request_counts.failed == 0
    stats = stack.sim.app.stats_dict()
    assert stats["batch"]["by_batch"].get(batch_id) == n, stats  # none sent twice
    assert stats["aborted"] == 0, stats  # no upstream request cut off
    acts = run_line_activities(await history(stack, batch_id))
    assert len(acts) == n  # scheduled once each: no line went back to the queue
    bad = [a for a in acts if a["closed"] in CLOSED_BADLY or a["closed"] is None]
    assert bad == [], bad
    return acts


async def wait_exited(worker: Child, within: float) -> int:
    code = await poll_until(
        lambda: worker.returncode,
        lambda c: c is not None,
        timeout=within,
        what=f"{worker.name} (pid {worker.pid}) to exit after SIGTERM",
        interval=0.1,
    )
    assert code is not None
    return code


async def test_sigterm_lets_running_lines_finish_on_that_worker(make_stack: MakeStack) -> None:
    stack = await make_stack(cap=4, sim=SLOW, extra_env={"BACKFILL_LOG_LEVEL": "INFO"})
    first = stack.workers[0]
    n = 12
    batch_id = await submit(stack, n)
    await wait_in_flight(stack, 4)  # all four on the only worker
    stack.start_worker()  # takes the lines the first one no longer takes
    signalled_at = datetime.now(UTC)
    first.send_signal(signal.SIGTERM)
    assert await wait_exited(first, within=60) == 0
    log = first.log_tail(20_000)
    assert "worker stopping" in log and "worker stopped" in log, log

    acts = await assert_nothing_lost(stack, batch_id, n)
    mine = identity(first)
    # The lines in flight at the signal were completed by the signalled worker itself, after
    # the signal: it finished them instead of abandoning them.
    finished_after = [
        a
        for a in acts
        if a["started_by"] == mine
        and a["closed"] == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
        and a["closed_at"] > signalled_at
    ]
    assert len(finished_after) >= 4, acts
    assert all(a["closed_by"] == mine for a in finished_after), finished_after
    # And it took no new line once signalled.
    late = [a for a in acts if a["started_by"] == mine and a["started_at"] > signalled_at]
    assert late == [], late


async def test_rolling_restart_of_every_worker_loses_nothing(make_stack: MakeStack) -> None:
    stack = await make_stack(cap=4, sim=SLOW, workers=2)
    n = 40
    batch_id = await submit(stack, n)
    client = stack.client()
    for old in list(stack.workers):
        await wait_in_flight(stack, 1)
        before = await client.batches.retrieve(batch_id)
        assert before.status == "in_progress", before  # the restart happens mid-batch
        stack.start_worker()  # the replacement first, as a rolling upgrade does
        old.send_signal(signal.SIGTERM)
        assert await wait_exited(old, within=60) == 0
    await assert_nothing_lost(stack, batch_id, n)


async def test_second_sigterm_exits_at_once(make_stack: MakeStack) -> None:
    stack = await make_stack(cap=4, sim=SLOW, extra_env={"BACKFILL_LOG_LEVEL": "INFO"})
    worker = stack.workers[0]
    n = 8
    batch_id = await submit(stack, n)
    await wait_in_flight(stack, 4)
    worker.send_signal(signal.SIGTERM)
    await poll_until(
        lambda: "worker stopping" in worker.log_tail(20_000),
        timeout=30,
        what="the worker to log that it is stopping",
    )
    assert worker.returncode is None  # still letting its 3 s lines finish
    worker.send_signal(signal.SIGTERM)
    # Status 143, not the 0 of a graceful stop: it did not wait for its lines.
    assert await wait_exited(worker, within=10) == 128 + signal.SIGTERM
    assert "exiting at once" in worker.log_tail(20_000)
    # Its lines were lost, as with SIGKILL: a new worker runs them again and the batch completes.
    stack.start_worker()
    batch = await wait_terminal(stack.client(), batch_id, within=240)
    assert batch.status == "completed" and batch.request_counts.completed == n, batch
