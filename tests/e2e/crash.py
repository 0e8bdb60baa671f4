"""A worker SIGKILLed while its lines run, and how long until those lines run again on another
worker, read from Temporal (the batch's history and pending activities). Used by
tests/e2e/test_crash.py and bench/crash_detection.py."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Literal

from temporalio.api.enums.v1 import EventType, PendingActivityState
from temporalio.client import Client

from tests.polling import poll_until
from tools.dev.procs import Child

Victim = Literal["sticky", "other", "busiest"]
LINE_ACTIVITY = "run_line"


def _identity_pid(identity: str) -> int | None:
    head = identity.split("@", 1)[0]
    return int(head) if head.isdigit() else None


class LineHistory:
    """What the batch's history says about its line activities (one run of the chain)."""

    def __init__(self) -> None:
        self.key_of: dict[str, tuple[int, int]] = {}
        """activity id -> (route index, position) of the line it runs."""
        self.timed_out_at: dict[str, float] = {}
        self.completed: set[str] = set()
        self.started_at: dict[str, tuple[float, str]] = {}
        """activity id -> (start time, worker identity), for activities already closed."""
        self.last_wft_identity: str | None = None

    @classmethod
    async def read(cls, client: Client, workflow_id: str) -> LineHistory:
        out = cls()
        sched_ids: dict[int, str] = {}
        history = await client.get_workflow_handle(workflow_id).fetch_history()
        for ev in history.events:
            t = ev.event_time.ToMicroseconds() / 1e6
            if ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                a = ev.activity_task_scheduled_event_attributes
                sched_ids[ev.event_id] = a.activity_id
                if a.activity_type.name == LINE_ACTIVITY:
                    body = json.loads(a.input.payloads[0].data)
                    out.key_of[a.activity_id] = (body["route_index"], body["position"])
            elif ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                a2 = ev.activity_task_started_event_attributes
                out.started_at[sched_ids[a2.scheduled_event_id]] = (t, a2.identity)
            elif ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT:
                a3 = ev.activity_task_timed_out_event_attributes
                out.timed_out_at[sched_ids[a3.scheduled_event_id]] = t
            elif ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
                a4 = ev.activity_task_completed_event_attributes
                out.completed.add(sched_ids[a4.scheduled_event_id])
            elif ev.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
                out.last_wft_identity = ev.workflow_task_started_event_attributes.identity
        return out


async def pending_started(client: Client, workflow_id: str) -> dict[str, tuple[float, str]]:
    """The batch's pending activities that a worker has started: id -> (start time, identity)."""
    desc = await client.get_workflow_handle(workflow_id).describe()
    out = {}
    for p in desc.raw_description.pending_activities:
        if p.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED:
            out[p.activity_id] = (
                p.last_started_time.ToMicroseconds() / 1e6,
                p.last_worker_identity,
            )
    return out


@dataclass
class Recovery:
    victim: str
    """Which worker was killed: `sticky` (it ran the batch's last workflow task) or `other`."""
    lost_lines: int
    timed_out_s: list[float] = field(default_factory=list)
    """When each lost line's activity timed out (heartbeat), seconds after the SIGKILL."""
    running_again_s: list[float] = field(default_factory=list)
    """When each lost line was started again by another worker, seconds after the SIGKILL."""

    @property
    def last_running_again_s(self) -> float | None:
        return max(self.running_again_s) if self.running_again_s else None


async def kill_and_time_recovery(
    client: Client, batch_id: str, workers: list[Child], victim: Victim, within: float = 120
) -> Recovery:
    """SIGKILL one of `workers` while the batch runs and wait (bounded) until every line that
    was running on it is running again on another worker.

    `victim`: `sticky` (the worker that ran the batch's last workflow task: the batch's next
    workflow task then also waits for its sticky queue, the worst case), `other`, or `busiest`
    (the one with the most of the batch's lines running)."""
    hist = await LineHistory.read(client, batch_id)
    pids = {w.pid: w for w in workers}
    sticky = _identity_pid(hist.last_wft_identity or "")
    pending = await pending_started(client, batch_id)
    if victim == "busiest":
        load = {pid: 0 for pid in pids}
        for _, ident in pending.values():
            pid = _identity_pid(ident)
            if pid in load:
                load[pid] += 1
        dead = pids[max(load, key=lambda p: load[p])]
    elif victim == "sticky" and sticky in pids:
        dead = pids[sticky]
    else:
        dead = next(w for w in workers if w.pid != sticky)
    killed_at = time.time()
    dead.kill()
    lost_ids = {a for a, (_, ident) in pending.items() if _identity_pid(ident) == dead.pid}
    seen: list[LineHistory] = []

    async def reruns() -> dict[tuple[int, int], float] | None:
        h = await LineHistory.read(client, batch_id)
        seen[:] = [h]
        lost = {h.key_of[a] for a in lost_ids if a not in h.completed}
        started = {**h.started_at, **await pending_started(client, batch_id)}
        out: dict[tuple[int, int], float] = {}
        for a, (t, ident) in started.items():
            key = h.key_of.get(a)
            if key in lost and a not in lost_ids and _identity_pid(ident) != dead.pid:
                out[key] = min(out.get(key, t), t)
        return out if set(out) >= lost else None

    again = await poll_until(
        reruns,
        lambda r: r is not None,
        timeout=within,
        what="every line of the killed worker to run again on another worker",
        interval=0.2,
    )
    assert again is not None
    h = seen[0]
    return Recovery(
        victim="sticky" if dead.pid == sticky else "other",
        lost_lines=len(again),
        timed_out_s=sorted(
            round(h.timed_out_at[a] - killed_at, 2) for a in lost_ids if a in h.timed_out_at
        ),
        running_again_s=sorted(round(t - killed_at, 2) for t in again.values()),
    )
