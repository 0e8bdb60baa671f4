"""A batch's lines on one route (a "lane"): pure bookkeeping the batch workflow acts on.

No temporalio import: what may start, what to requeue, and when to tell the route's scheduler
that demand changed are decided here and unit-tested without a server.

"The lines of a route" at each stage: `backfill.files.RouteLines` is the store's index entry
(route, model, line count, written by validation into the batch's index); validation answers
the workflow with one `RouteAssignment` per entry (adding its position in the
route list); the workflow builds a `Lane` from each (`Lane.from_assignment`) and keeps its
progress there.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from backfill.platform.ids import scheduler_workflow_id
from backfill.routes.gates.backoff import backoff_delay


class RouteAssignment(BaseModel):
    """The lines of a batch assigned to one route at validation (fixed from then on)."""

    index: int
    """Position in the batch's route list; names the route's line list in the store."""
    route_id: str
    model: str
    total: int


class Tries(BaseModel):
    """Why a line ran before without being committed (kept apart: separate budgets)."""

    retries: int = 0
    """Rate limited / unavailable / connection refused answers."""
    lost: int = 0
    """Activities lost (the worker died, the activity crashed)."""
    preempted: int = 0
    """Runs ended early to give the seat back to live traffic (preemptive yield)."""


class Lane(BaseModel):
    """A `RouteAssignment` (the batch's lines on one route, fixed at validation) with the
    progress of those lines in this batch: built by `from_assignment`, carried over
    continue-as-new in `BatchState.lanes`."""

    index: int
    """The route's position in the batch's route list (names its line list in the store)."""
    route_id: str
    model: str
    total: int
    """Lines of the batch on this route."""
    next_pos: int = 0
    """Next never-started position in the route's line list."""
    requeued: list[int] = Field(default_factory=list)
    """Positions to run again before new ones (lost or rate limited)."""
    attempts: dict[int, Tries] = Field(default_factory=dict)
    """Earlier uncommitted runs of requeued positions."""
    finished: int = 0
    running: int = 0
    allotment: int = 0
    """Lines this batch may keep running on the route (the scheduler's latest word, capped by
    the demand last reported)."""
    epoch: int = 0
    unacked_epoch: int | None = None
    """Epoch of a shrink the scheduler waits to hear we are within."""
    reported: int | None = None
    """Demand last reported to the scheduler (None: not registered)."""
    reported_at: float | None = None
    """When it was last reported (unix seconds, workflow time)."""
    backoff_until: float | None = None
    backoff_level: int = 0
    stopped: bool = False
    """No new line starts (cancelled or expired)."""
    priority: int | None = None
    """The route's priority hint, from the scheduler's latest allotment."""
    preempted_lines: int = 0
    """Runs ended early to give their seat to live traffic (preemptive yield), each run again."""
    wasted_tokens: int = 0
    """Tokens those runs had generated, thrown away (the workers' estimates, summed)."""
    reprefill_tokens: int = 0
    """Tokens runs that continued a preempted line's partial answer sent again as prompt."""
    line_seconds: float | None = None
    """Mean seconds a finished line held its slot (workflow time, start to outcome); None
    until one finished. The scheduler judges the batch's deadline by it."""
    timed_lines: int = 0
    """Finished lines in `line_seconds`."""
    reported_timed_lines: int = 0
    """`timed_lines` when the demand last carried `line_seconds` (0: it never did)."""

    @classmethod
    def from_assignment(cls, a: RouteAssignment) -> Lane:
        """The lane of a route the validation assigned lines to, before any line ran."""
        return cls(index=a.index, route_id=a.route_id, model=a.model, total=a.total)

    @property
    def scheduler_id(self) -> str:
        return scheduler_workflow_id(self.route_id)

    @property
    def done(self) -> bool:
        return self.finished >= self.total

    def pending_count(self) -> int:
        if self.stopped:
            return 0
        return self.total - self.next_pos + len(self.requeued)

    def can_start(self, now: float) -> bool:
        if self.backoff_until is not None and now < self.backoff_until:
            return False
        return self.running < self.allotment and self.pending_count() > 0

    def take(self) -> tuple[int, Tries]:
        """Mark the next line running; returns (position, its earlier uncommitted runs)."""
        if self.requeued:
            position = self.requeued.pop(0)
        else:
            position = self.next_pos
            self.next_pos += 1
        self.running += 1
        return position, self.attempts.pop(position, None) or Tries()

    def requeue(self, position: int, tries: Tries) -> None:
        self.requeued.insert(0, position)
        self.attempts[position] = tries

    def requeue_preempted(self, position: int, tries: Tries, wasted_tokens: int) -> None:
        """A run preempted for live traffic: first in the queue again, with no back-off and no
        retry counted (`Tries.preempted` counts it), and its cost counted on the lane."""
        self.requeue(position, tries.model_copy(update={"preempted": tries.preempted + 1}))
        self.preempted_lines += 1
        self.wasted_tokens += max(0, wasted_tokens)

    def finish(self) -> None:
        """A line ended for good (committed, or given up): the route's back-off level starts
        over."""
        self.finished += 1
        self.backoff_level = 0

    def time_line(self, seconds: float) -> None:
        """A finished line held its slot `seconds`: into the running mean."""
        n = self.timed_lines
        self.line_seconds = ((self.line_seconds or 0.0) * n + max(seconds, 0.0)) / (n + 1)
        self.timed_lines = n + 1

    def back_off(self, now: float, retry_after: float | None = None) -> None:
        """429/503/refused: no new line on this route for a while (doubling, capped), or for
        the upstream's Retry-After when given and longer."""
        self.backoff_level += 1
        self.backoff_until = now + backoff_delay(self.backoff_level - 1, retry_after)

    def stop(self) -> None:
        self.stopped = True

    def set_allotment(self, epoch: int, lines: int, priority: int | None = None) -> None:
        if epoch <= self.epoch:
            return  # stale
        self.priority = priority
        if lines < self.allotment or self.unacked_epoch is not None:
            self.unacked_epoch = epoch
        self.epoch = epoch
        self.allotment = lines
        if self.reported is not None:
            self.allotment = min(self.allotment, max(self.reported, 0))

    def state(self, *, paused: bool) -> str:
        if self.done:
            return "done"
        if paused:
            return "paused"
        if self.running > 0:
            return "running"
        return "queued"


def demand_to_report(lane: Lane, *, halt: bool) -> int | None:
    """The demand to report to the route's scheduler now, or None if nothing worth saying.

    Demand = lines running + lines that could start (none when `halt`: paused, cancelling,
    expired). Rises are reported at once; falls only when they matter (below the allotment),
    in steps of a quarter, and always the final 0, so the signal count stays logarithmic.
    """
    wanted = lane.running + (0 if halt else lane.pending_count())
    if lane.reported is None:
        return wanted if wanted > 0 else None
    if wanted > lane.reported:
        return wanted
    if wanted == lane.reported:
        return None
    if wanted == 0:
        return 0
    if wanted >= lane.allotment:
        return None
    if wanted <= lane.reported * 3 // 4:
        return wanted
    return None


def pace_to_report(lane: Lane, *, halt: bool) -> int | None:
    """A demand worth reporting, beyond `demand_to_report`'s, for the scheduler to judge the
    batch's deadline (deadline-aware shares, docs/decisions/0038): the lines not finished, once
    the first line has finished, when they fell by a quarter since the last report (even while
    the allotment is below them), or when twice as many lines have finished since the mean line
    time was last reported. None: nothing worth saying (nor while `halt`: no line may start,
    whatever the deadline). Logarithmic in the lines, as `demand_to_report`.

    Decided by counts alone, never by `line_seconds`: the mean is workflow time measured
    between activations, and whether a report (an activity) is scheduled must be the same on
    every replay, whatever time each activation saw. The mean is only the report's payload."""
    if halt or lane.reported is None or lane.timed_lines == 0:
        return None
    wanted = lane.running + lane.pending_count()
    if wanted <= 0:
        return None
    if lane.reported_timed_lines == 0 or wanted <= lane.reported * 3 // 4:
        return wanted
    if lane.timed_lines >= 2 * lane.reported_timed_lines:
        return wanted
    return None
