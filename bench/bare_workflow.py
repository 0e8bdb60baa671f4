"""The bare baseline: one workflow running N trivial activities, a sliding window of W in flight.

It mirrors BatchWorkflow's shape without any of its bookkeeping: no scheduler, no store, no HTTP,
no pydantic state. Like BatchWorkflow it drains and continues-as-new after `per_run` finished
activities (or when Temporal suggests it), so both pay the same continue-as-new pauses and the
comparison isolates what backfill adds per line.

With `work` set, each activity does instead what any gateway must do for a line, whatever
dispatches it (`bench.line_work.LineWork`): read the line from the input file, POST its body
to the model server and write the answer durably. The ratio against that baseline is
backfill's dispatch overhead alone; the ratio against the no-op one also counts the line's own
work.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from pydantic import BaseModel
from temporalio import activity, workflow
from temporalio.common import RetryPolicy


class BareInput(BaseModel):
    total: int
    window: int
    per_run: int = 2_000
    done: int = 0
    """Activities finished in earlier runs (carried across continue-as-new)."""
    runs: int = 1
    latency_s: float = 0.0
    """Each activity waits this long, like a line waiting for its upstream (0: a no-op)."""
    heartbeat_s: float | None = None
    """Each activity's heartbeat timeout (the server keeps a timer per activity for it)."""
    work: bool = False
    """Each activity is `bench.line_work.LineWork.line_work` (a line's read, request and
    durable write), by name: this module stays importable in the workflow sandbox."""


class BareResult(BaseModel):
    done: int
    runs: int


@activity.defn
async def noop(i: int) -> int:
    return i


@activity.defn
async def wait_like_upstream(seconds: float) -> None:
    """A line's shape without its work: the activity waits as for a model's answer."""
    await asyncio.sleep(seconds)


@workflow.defn
class BareWorkflow:
    @workflow.run
    async def run(self, inp: BareInput) -> BareResult:
        next_i = inp.done
        done = inp.done
        this_run = 0
        draining = False
        pending: list[asyncio.Future[Any]] = []
        while True:
            while not draining and len(pending) < inp.window and next_i < inp.total:
                if inp.work:
                    call = workflow.execute_activity(
                        "line_work",
                        next_i,
                        start_to_close_timeout=timedelta(seconds=60),
                        heartbeat_timeout=(
                            timedelta(seconds=inp.heartbeat_s) if inp.heartbeat_s else None
                        ),
                        retry_policy=RetryPolicy(maximum_attempts=1),
                    )
                elif inp.latency_s > 0:
                    call = workflow.execute_activity(
                        wait_like_upstream,
                        inp.latency_s,
                        start_to_close_timeout=timedelta(seconds=60 + inp.latency_s),
                        retry_policy=RetryPolicy(maximum_attempts=1),
                    )
                else:
                    call = workflow.execute_activity(
                        noop,
                        next_i,
                        start_to_close_timeout=timedelta(seconds=60),
                        retry_policy=RetryPolicy(maximum_attempts=1),
                    )
                pending.append(asyncio.ensure_future(call))
                next_i += 1
            if not pending:
                break
            finished, pending = await workflow.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            done += len(finished)
            this_run += len(finished)
            if this_run >= inp.per_run or workflow.info().is_continue_as_new_suggested():
                draining = True
            if draining and not pending:
                if done >= inp.total:
                    break
                workflow.continue_as_new(
                    inp.model_copy(update={"done": done, "runs": inp.runs + 1})
                )
        return BareResult(done=done, runs=inp.runs)
