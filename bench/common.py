"""Shared pieces of the benches: a private dev server, CPU accounting, and history analysis.

Nothing here changes the project: it only starts processes on loopback (a dev server in a
temporary directory, optionally a simulator process) and reads workflow histories back.
"""

from __future__ import annotations

import contextlib
import os
import resource
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from tools.dev.devserver import DevServer, free_port

MAX_RUNS_FOLLOWED = 1_000
"""Bound on the continue-as-new chain walked when reading a workflow's histories."""

_ENV_OVERRIDES = ("BACKFILL_", "TEMPORAL_")


def log(msg: str) -> None:
    """Progress to stderr (stdout stays clean for --json)."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def clear_settings_env() -> list[str]:
    """Drop BACKFILL_* / TEMPORAL_* from this process's environment.

    backfill's Settings let the environment win over constructor arguments; a bench must use
    its own dev server, data directory and task queues whatever the shell exports."""
    dropped = [k for k in os.environ if k.startswith(_ENV_OVERRIDES)]
    for k in dropped:
        del os.environ[k]
    return dropped


@contextlib.asynccontextmanager
async def dev_server(
    tmp: Path,
    *,
    dynamic_config: Iterable[str] = (),
    in_memory: bool = False,
    ready_timeout: float = 90.0,
) -> AsyncIterator[DevServer]:
    """A headless dev server on a free port with its state under `tmp`; always stopped."""
    server = DevServer(
        tmp / "temporal",
        port=free_port(),
        ui_port=None,
        db_filename=None if in_memory else "temporal.db",
        dynamic_config=list(dynamic_config),
    )
    server.start()
    try:
        await server.wait_ready_async(timeout=ready_timeout)
        yield server
    finally:
        import asyncio

        await asyncio.to_thread(server.stop)


# ---- CPU accounting ------------------------------------------------------------------------------
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def proc_cpu_seconds(pid: int | None) -> float:
    """user+system CPU seconds of a process (and its reaped children), 0 if unreadable."""
    if pid is None:
        return 0.0
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[-1].split()
    # after ")": state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14)
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return (utime + stime + cutime + cstime) / _TICK


def thread_cpu_seconds() -> dict[int, tuple[str, float]]:
    """CPU seconds of each live thread of this process: {native id: (group, seconds)}.

    Groups: `event_loop` (the main thread: activities, the SDK's Python glue, httpx),
    `workflow` (the SDK's workflow-activation threads: the workflow code in its sandbox),
    `line_store` (run_line's store threads), `sdk_core` (threads Python does not know: the
    SDK's Rust core, gRPC and protobuf), `other` (any other Python thread)."""
    import threading

    names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    out: dict[int, tuple[str, float]] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid_s in tids:
        tid = int(tid_s)
        try:
            stat = Path(f"/proc/self/task/{tid}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        cpu = (int(fields[11]) + int(fields[12])) / _TICK
        name = names.get(tid)
        if name is None:
            group = "sdk_core"
        elif name == "MainThread":
            group = "event_loop"
        elif name.startswith("temporal_workflow"):
            group = "workflow"
        elif name.startswith("line-store"):
            group = "line_store"
        else:
            group = "other"
        out[tid] = (group, cpu)
    return out


def _thread_delta(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]
) -> dict[str, float]:
    """CPU seconds per thread group between two snapshots (threads that ended are lost)."""
    out: dict[str, float] = {}
    for tid, (group, cpu) in after.items():
        out[group] = out.get(group, 0.0) + cpu - before.get(tid, (group, 0.0))[1]
    return {k: round(v, 2) for k, v in sorted(out.items())}


def self_cpu_seconds() -> float:
    """CPU seconds of this process, every thread (Python, the SDK's Rust core, the simulator)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


@dataclass
class CpuSpan:
    """Wall and CPU time over one phase: this process, the dev server, and helper processes
    (a simulator process, an activity-worker process) when there are any."""

    wall_s: float = 0.0
    bench_cpu_s: float = 0.0
    server_cpu_s: float = 0.0
    sim_cpu_s: float = 0.0
    activity_worker_cpu_s: float = 0.0
    threads_cpu_s: dict[str, float] = field(default_factory=dict)
    """This process's CPU seconds by thread group (`thread_cpu_seconds`)."""


class CpuMeter:
    def __init__(self, server_pid: int | None, sim_pid: int | None = None) -> None:
        self.server_pid, self.sim_pid = server_pid, sim_pid
        self.activity_worker_pid: int | None = None

    @contextlib.contextmanager
    def span(self) -> Iterator[CpuSpan]:
        out = CpuSpan()
        w0, b0 = time.monotonic(), self_cpu_seconds()
        s0, m0 = proc_cpu_seconds(self.server_pid), proc_cpu_seconds(self.sim_pid)
        a_pid = self.activity_worker_pid
        a0 = proc_cpu_seconds(a_pid)
        t0 = thread_cpu_seconds()
        try:
            yield out
        finally:
            out.wall_s = time.monotonic() - w0
            out.bench_cpu_s = self_cpu_seconds() - b0
            out.server_cpu_s = proc_cpu_seconds(self.server_pid) - s0
            out.sim_cpu_s = proc_cpu_seconds(self.sim_pid) - m0
            out.activity_worker_cpu_s = proc_cpu_seconds(a_pid) - a0
            out.threads_cpu_s = _thread_delta(t0, thread_cpu_seconds())


# ---- histories -----------------------------------------------------------------------------------
def _ts(ev: Any) -> float:
    return float(ev.event_time.ToMicroseconds()) / 1e6


@dataclass
class ActivityTimes:
    count: int = 0
    first_scheduled: float | None = None
    last_closed: float | None = None
    schedule_to_start_s: float = 0.0
    """Sum over activities (matching + worker poll latency)."""
    start_to_close_s: float = 0.0
    """Sum over activities (the activity's own run time as the server saw it)."""
    schedule_to_close_s: float = 0.0

    def mean_ms(self, total: float) -> float:
        return 1000.0 * total / self.count if self.count else 0.0

    @property
    def span_s(self) -> float:
        if self.first_scheduled is None or self.last_closed is None:
            return 0.0
        return self.last_closed - self.first_scheduled

    @property
    def mean_in_flight(self) -> float:
        """Average activities open (scheduled, not closed) over the span: effective concurrency."""
        return self.schedule_to_close_s / self.span_s if self.span_s > 0 else 0.0


@dataclass
class RunStats:
    run_id: str
    events: int
    start: float
    end: float
    lines_first_scheduled: float | None = None
    lines_last_scheduled: float | None = None
    lines_last_closed: float | None = None
    lines: int = 0


@dataclass
class HistoryStats:
    workflow_id: str
    runs: list[RunStats] = field(default_factory=list)
    event_types: Counter[str] = field(default_factory=Counter)
    activities: dict[str, ActivityTimes] = field(default_factory=dict)
    workflow_tasks: int = 0
    wft_schedule_to_start_s: float = 0.0
    wft_start_to_close_s: float = 0.0
    wft_timeouts: int = 0
    wft_timeout_waits_s: float = 0.0
    """Time workflow tasks sat scheduled until they timed out (schedule-to-start on the sticky
    queue: the worker did not pick them up), summed."""
    wft_failures: int = 0

    @property
    def total_events(self) -> int:
        return sum(r.events for r in self.runs)

    def can_gaps(self) -> list[dict[str, float]]:
        """Per continue-as-new: the drain tail (last line scheduled → last line closed in the
        old run) and the idle gap (last line closed → first line scheduled in the new run)."""
        out = []
        for a, b in zip(self.runs, self.runs[1:], strict=False):
            if a.lines_last_closed is None or b.lines_first_scheduled is None:
                continue
            tail = (a.lines_last_closed - a.lines_last_scheduled) if a.lines_last_scheduled else 0
            out.append(
                {"drain_tail_s": tail, "idle_gap_s": b.lines_first_scheduled - a.lines_last_closed}
            )
        return out

    def summary(self, line_activity: str) -> dict[str, Any]:
        acts = self.activities.get(line_activity, ActivityTimes())
        gaps = self.can_gaps()
        n = acts.count or 1
        return {
            "workflow_id": self.workflow_id,
            "runs": len(self.runs),
            "events": self.total_events,
            "events_per_run": [r.events for r in self.runs],
            "events_per_line": round(self.total_events / n, 2),
            "event_types": dict(self.event_types.most_common()),
            "workflow_tasks": self.workflow_tasks,
            "workflow_tasks_per_line": round(self.workflow_tasks / n, 3),
            "wft_mean_schedule_to_start_ms": _mean_ms(
                self.wft_schedule_to_start_s, self.workflow_tasks
            ),
            "wft_mean_start_to_close_ms": _mean_ms(self.wft_start_to_close_s, self.workflow_tasks),
            "wft_busy_s": round(self.wft_start_to_close_s, 2),
            "wft_timeouts": self.wft_timeouts,
            "wft_timeout_waits_s": round(self.wft_timeout_waits_s, 2),
            "wft_failures": self.wft_failures,
            "line_activities": acts.count,
            "line_span_s": round(acts.span_s, 3),
            "line_mean_in_flight": round(acts.mean_in_flight, 1),
            "line_mean_schedule_to_start_ms": round(acts.mean_ms(acts.schedule_to_start_s), 1),
            "line_mean_start_to_close_ms": round(acts.mean_ms(acts.start_to_close_s), 1),
            "line_mean_schedule_to_close_ms": round(acts.mean_ms(acts.schedule_to_close_s), 1),
            "other_activities": {
                name: {
                    "count": a.count,
                    "mean_schedule_to_close_ms": round(a.mean_ms(a.schedule_to_close_s), 1),
                    "total_schedule_to_close_s": round(a.schedule_to_close_s, 3),
                }
                for name, a in self.activities.items()
                if name != line_activity
            },
            "continue_as_new": [{k: round(v, 3) for k, v in g.items()} for g in gaps],
            "continue_as_new_idle_s": round(sum(g["idle_gap_s"] for g in gaps), 3),
            "continue_as_new_drain_tail_s": round(sum(g["drain_tail_s"] for g in gaps), 3),
        }


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _mean_ms(total_s: float, n: int) -> float:
    return round(1000.0 * total_s / n, 2) if n else 0.0


_CLOSE_TYPES = {
    EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED: "activity_task_completed_event_attributes",
    EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED: "activity_task_failed_event_attributes",
    EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT: "activity_task_timed_out_event_attributes",
    EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED: "activity_task_canceled_event_attributes",
}


async def analyze_chain(
    client: Client,
    workflow_id: str,
    first_run_id: str | None,
    line_activity: str,
    dump_dir: Path | None = None,
) -> HistoryStats:
    """Read every run of a workflow, following continue-as-new from `first_run_id` (exact; no
    dependence on visibility lag), and gather event counts and activity / workflow-task timings."""
    stats = HistoryStats(workflow_id)
    run_id = first_run_id
    for _ in range(MAX_RUNS_FOLLOWED):
        history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        events = list(history.events)
        if dump_dir is not None:
            name = workflow_id.replace(":", "_")
            _write(dump_dir / f"{name}.run{len(stats.runs)}.json", history.to_json())
        if not events:
            break
        run = RunStats(run_id or "", len(events), _ts(events[0]), _ts(events[-1]))
        scheduled: dict[int, tuple[str, float]] = {}
        started: dict[int, float] = {}
        wft_sched: dict[int, float] = {}
        wft_started: dict[int, float] = {}
        for ev in events:
            et = ev.event_type
            stats.event_types[EventType.Name(et).removeprefix("EVENT_TYPE_")] += 1
            t = _ts(ev)
            if et == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                name = ev.activity_task_scheduled_event_attributes.activity_type.name
                scheduled[ev.event_id] = (name, t)
                if name == line_activity:
                    if run.lines_first_scheduled is None:
                        run.lines_first_scheduled = t
                    run.lines_last_scheduled = t
            elif et == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                started[ev.activity_task_started_event_attributes.scheduled_event_id] = t
            elif et in _CLOSE_TYPES:
                sid = getattr(ev, _CLOSE_TYPES[et]).scheduled_event_id
                name, t_sched = scheduled.get(sid, ("?", t))
                acts = stats.activities.setdefault(name, ActivityTimes())
                acts.count += 1
                t_start = started.get(sid, t_sched)
                acts.schedule_to_start_s += t_start - t_sched
                acts.start_to_close_s += t - t_start
                acts.schedule_to_close_s += t - t_sched
                if acts.first_scheduled is None or t_sched < acts.first_scheduled:
                    acts.first_scheduled = t_sched
                if acts.last_closed is None or t > acts.last_closed:
                    acts.last_closed = t
                if name == line_activity:
                    run.lines += 1
                    run.lines_last_closed = t
            elif et == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
                wft_sched[ev.event_id] = t
            elif et == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
                sid = ev.workflow_task_started_event_attributes.scheduled_event_id
                wft_started[ev.event_id] = t
                stats.wft_schedule_to_start_s += t - wft_sched.get(sid, t)
            elif et == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
                attrs_to = ev.workflow_task_timed_out_event_attributes
                stats.wft_timeouts += 1
                stats.wft_timeout_waits_s += t - wft_sched.get(attrs_to.scheduled_event_id, t)
            elif et == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
                stats.wft_failures += 1
            elif et == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
                sid = ev.workflow_task_completed_event_attributes.started_event_id
                stats.workflow_tasks += 1
                stats.wft_start_to_close_s += t - wft_started.get(sid, t)
        stats.runs.append(run)
        last = events[-1]
        if last.event_type != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
            break
        attrs = last.workflow_execution_continued_as_new_event_attributes
        run_id = attrs.new_execution_run_id
    return stats


async def all_run_ids(client: Client, workflow_id: str, limit: int = MAX_RUNS_FOLLOWED) -> list:
    """Visibility's rows for a workflow id (every continued run is its own row)."""
    rows = []
    async for ex in client.list_workflows(f"WorkflowId = '{workflow_id}'", limit=limit):
        rows.append(ex)
    return rows


async def first_run_id(client: Client, workflow_id: str) -> str | None:
    """The earliest run of a workflow id (by start time) according to visibility."""
    rows = await all_run_ids(client, workflow_id)
    if not rows:
        return None
    return min(rows, key=lambda ex: ex.start_time).run_id


def as_dict(obj: Any) -> Any:
    return asdict(obj)


async def await_result(
    client: Client,
    handle: Any,
    deadline_s: float,
    *,
    poll_s: float = 3.0,
    max_wft_attempts: int = 3,
) -> Any:
    """The workflow's result (following continue-as-new), within `deadline_s` seconds.

    Meanwhile the latest run is described every `poll_s` seconds: a workflow task that keeps
    failing (a bug, not slowness: its last attempt ended WORKFLOW_TASK_FAILED) ends the wait
    early with the failure's message instead of spinning until the timeout; repeated timeouts
    are only logged. On any error the workflow is terminated (best effort)."""
    import asyncio

    loop = asyncio.get_running_loop()
    deadline = loop.time() + deadline_s
    result_task = asyncio.ensure_future(handle.result())
    last_attempt = 0
    try:
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(f"{handle.id} did not finish within {deadline_s:.0f}s")
            done, _ = await asyncio.wait({result_task}, timeout=min(poll_s, remaining))
            if done:
                return result_task.result()
            desc = await client.get_workflow_handle(handle.id).describe()
            attempt = desc.raw_description.pending_workflow_task.attempt
            if attempt >= max_wft_attempts and attempt != last_attempt:
                last_attempt = attempt
                failure = await _last_wft_failure(client, handle.id)
                # UNHANDLED_COMMAND is the server's "new events arrived, decide again": not a bug.
                if failure is not None and not failure.startswith(
                    "WORKFLOW_TASK_FAILED_CAUSE_UNHANDLED_COMMAND"
                ):
                    raise RuntimeError(
                        f"{handle.id}: workflow task failing (attempt {attempt}): {failure}"
                    )
                log(f"{handle.id}: workflow task attempt {attempt}: {failure or 'timed out'}")
    except BaseException:
        result_task.cancel()
        try:
            await asyncio.wait_for(
                client.get_workflow_handle(handle.id).terminate(reason="bench aborted"), 10
            )
        except Exception as err:  # already closed, or the server is going away
            log(f"terminate {handle.id}: {type(err).__name__}")
        raise


async def _last_wft_failure(client: Client, workflow_id: str) -> str | None:
    """The failure message of the latest run's last workflow task, if that task failed."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    for ev in reversed(list(history.events)):
        if ev.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
            from temporalio.api.enums.v1 import WorkflowTaskFailedCause

            a = ev.workflow_task_failed_event_attributes
            cause = WorkflowTaskFailedCause.Name(a.cause)
            return f"{cause}: {a.failure.message} {a.failure.stack_trace[-1500:]}".strip()
        if ev.event_type in (
            EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED,
            EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT,
        ):
            return None
    return None
