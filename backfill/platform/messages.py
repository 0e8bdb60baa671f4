"""Inputs and outputs of every workflow, signal, update and activity (one object each).

Plain pydantic models, safe inside the workflow sandbox; fields may be added with defaults
without breaking running workflows. Models that belong to a concept live in its module and are
imported from there, never through this one (a gate's signal payloads in its gate module,
`RouteSettings` in `backfill.routes.settings`, the status in `backfill.routes.status`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from backfill.batches.batch import Batch, BatchError, SubmitEstimate, TokenCounts
from backfill.batches.lanes import Lane, RouteAssignment
from backfill.routes.gates.preempt import PreemptPolicy
from backfill.routes.settings import RouteSettings, SettingSource

EndReason = Literal["completed", "expired", "cancelled"]


# ---- workflows ----
class BatchState(BaseModel):
    """A batch's state carried across continue-as-new."""

    batch: Batch
    lanes: list[Lane] = Field(default_factory=list)


class BatchInput(BaseModel):
    """BatchWorkflow's input (workflow id = batch id)."""

    batch_id: str
    workspace: str
    input_file_id: str
    endpoint: str
    completion_window: str
    created_at: int
    metadata: dict[str, str] | None = None
    allowed_models: list[str] | None = None
    """Identity snapshot: the models the creating key may use (None: every model). The batch
    runs under this snapshot to the end, whatever happens to the key later."""
    key_id: str | None = None
    """Identity snapshot: the id of the key that created the batch (never the key)."""
    role: str | None = None
    """Identity snapshot: that key's role when the batch was created."""
    line_timeout_seconds: float = 600.0
    max_line_retries: int = 5
    line_heartbeat_timeout_seconds: float | None = None
    """`limits.line_heartbeat_timeout_seconds` when the batch was created (None: a batch from
    before the setting existed, which uses the workflow's default)."""
    output_expires_after_seconds: int | None = None
    """`output_expires_after`: the output and error files expire this long after they are
    assembled (None: kept until deleted)."""
    estimate: SubmitEstimate | None = None
    """The estimate at submit (the api's; the batch shows it as `backfill.estimate`)."""
    state: BatchState | None = None
    """Carried across continue-as-new; None on the first run."""


class BatchSlot(BaseModel):
    """What the scheduler knows of one batch on this route."""

    batch_id: str
    workspace: str
    wanted: int = 0
    allotment: int = 0
    """Lines the batch may keep running (last decided)."""
    held: int = 0
    """Slots counted as used: the old allotment until a shrink is acknowledged."""
    epoch: int = 0
    """Epoch of the last allotment sent to the batch."""
    sent: int = 0
    """Allotment last sent (so only changes are signalled)."""
    sent_priority: int | None = None
    """Priority hint last sent with it."""
    last_served: int = 0
    arrived: int = 0
    """Arrival sequence (queue order among equals)."""
    weight: int = 1
    """Share weight of the batch's workspace, as its last demand said."""
    expires_at: float | None = None
    """When the batch expires (Unix seconds), as its demand said (None: not said)."""
    line_seconds: float | None = None
    """Seconds a line of the batch holds a slot, as its last demand that said so measured."""


class SchedulerInput(BaseModel):
    """RouteSchedulerWorkflow's input, and also its whole mutable state: the workflow changes
    it in place and continues-as-new with it, so a new run starts from where the last one was.
    Starting a scheduler sets only `route_id` and `settings`; every other field is state."""

    route_id: str
    settings: RouteSettings = Field(default_factory=RouteSettings)
    sources: dict[str, SettingSource] = Field(default_factory=dict)
    """Where each setting came from, as recorded (`backfill.routes.settings.sources_of` fills in
    the fields a scheduler started before sources were kept does not record)."""
    configured: dict[str, Any] | None = None
    """The config file's `settings` table last applied (`ConfiguredSettings.declared`; None: the
    scheduler started before settings as code and no worker has sent one since)."""
    batches: dict[str, BatchSlot] = Field(default_factory=dict)
    seq: int = 0
    targets: dict[str, int] = Field(default_factory=dict)
    """Fair shares last computed. Recomputed only when demand, settings or the set of batches
    change, or at each reconcile tick (which rotates uneven remainders), never on a mere
    acknowledgement: otherwise remainder slots would hop between batches after every line."""
    replan: bool = True
    reconcile_seconds: float = 30.0
    """How often slots held by batches are checked against Temporal (vanished batches)."""
    gate_reason: str | None = None
    """Why the route holds every line back now (None: open); kept to log and count changes."""
    gates: dict[str, Any] = Field(default_factory=dict)
    """Each gate's state by its key (`backfill.routes.gates.GateState`: the live counts, the
    back-off, the load verdict, the ramp, the held-back seats, ...), read typed through the
    registry. A key missing: that gate's initial state."""

    @model_validator(mode="before")
    @classmethod
    def _gate_states_of_old_runs(cls, data: Any) -> Any:
        """Runs from before the gate registry held gate state kept it in fields of their own
        (recorded histories and continue-as-new inputs carry them): moved into `gates`."""
        if isinstance(data, dict) and any(k in data for k in _OLD_GATE_FIELDS):
            data = dict(data)
            gates = dict(data.get("gates") or {})
            for key in _OLD_GATE_FIELDS:
                if key in data:
                    gates.setdefault(key, data.pop(key))
            data["gates"] = gates
        return data

    @model_serializer(mode="wrap")
    def _gate_states_where_old_runs_read_them(
        self, handler: SerializerFunctionWrapHandler
    ) -> dict[str, Any]:
        """The built-in gates' states are written in their old fields, where a worker from
        before the registry reads them: during a rolling upgrade either version continues the
        other's runs with the same state (and replays them alike). Other gates' stay in
        `gates` (absent when there are none)."""
        data: dict[str, Any] = handler(self)
        gates = dict(data.pop("gates", None) or {})
        for key in _OLD_GATE_FIELDS:
            if key in gates:
                data[key] = gates.pop(key)
        if gates:
            data["gates"] = gates
        return data


_OLD_GATE_FIELDS = ("live", "backoff", "load", "ramp", "held_back")
"""`SchedulerInput`'s fields of gate state before `gates` (their keys there are the same)."""


class LiveGateView(BaseModel):
    """What an api process needs to decide whether its count could change the gate
    (`live_gate` query: no history)."""

    threshold: int | None
    """"Yield to live traffic" (None: off)."""
    counts: dict[str, int] = Field(default_factory=dict)
    """Each process's count as the scheduler holds it (stale ones left out)."""
    every_change: bool = False
    """Seat-aware admission is on: its allotment follows every change of the live count."""
    preempt: PreemptPolicy | None = None
    """Preemptive yield's policy (None: off): the api sends its live count straight to the
    workers too."""


class LiveCountReport(BaseModel):
    """An api process's live count on a route, sent straight to each worker while the route's
    preemptive yield is on (`POST /preempt/live` of the worker's HTTP server). Counts only: the
    worker reads the route's policy from its scheduler (`backfill.preemption.policy`)."""

    model_config = ConfigDict(extra="forbid")

    route: str = Field(min_length=1, max_length=200)
    """A configured route (the worker refuses any other)."""
    process: str = Field(min_length=1, max_length=200)
    live: int = Field(ge=0, le=100_000)
    """Live requests in flight on the route in that process."""
    ttft_ms: float | None = Field(default=None, ge=0, le=3_600_000, allow_inf_nan=False)
    policy: dict[str, object] | None = Field(default=None, exclude=True)
    """Ignored: api processes of earlier versions sent the route's policy here (a worker of this
    version reads it from the route's scheduler); accepted so they keep working while the two
    versions run side by side."""
    """The p90 time to first token of the process's streamed live requests on the route over the
    last few seconds (None: none), for the live-latency target."""


class PeerLinesReport(BaseModel):
    """A worker's batch lines upstream on a route, sent to every other worker while the route's
    preemptive yield is on (`POST /preempt/lines`), so each counts the route's whole picture."""

    model_config = ConfigDict(extra="forbid")

    worker: str = Field(min_length=1, max_length=200)
    route: str = Field(min_length=1, max_length=200)
    """A configured route (the worker refuses any other)."""
    lines: list[tuple[Annotated[float, Field(ge=0, le=1e6, allow_inf_nan=False)], bool]] = Field(
        max_length=4096
    )
    """Each line: seconds since it went upstream, whether it may still be preempted."""
    started_at: list[Annotated[float, Field(ge=0, le=1e10, allow_inf_nan=False)]] | None = Field(
        default=None, max_length=4096
    )
    """When each line went upstream, in unix seconds by the sending worker's clock: every
    worker ranks the route's lines by these same numbers, so all choose the same ones (None: a
    worker of 0.2.0, whose lines are ranked by their age on arrival)."""

    @model_validator(mode="after")
    def _one_time_a_line(self) -> PeerLinesReport:
        if self.started_at is not None and len(self.started_at) != len(self.lines):
            raise ValueError("started_at must give one time for each line")
        return self


# ---- activities ----
class ValidateInput(BaseModel):
    batch_id: str
    input_file_id: str
    endpoint: str
    allowed_models: list[str] | None = None


class ValidateOutput(BaseModel):
    errors: list[BatchError] = Field(default_factory=list)
    total: int = 0
    routes: list[RouteAssignment] = Field(default_factory=list)
    models: list[str] = Field(default_factory=list)


class LineInput(BaseModel):
    batch_id: str
    input_file_id: str
    endpoint: str
    route_id: str
    route_index: int
    position: int
    """Position in the route's line list (not the line number)."""
    final_attempt: bool = True
    """When False, a 429/503/connection failure is not committed: the line goes back to the
    queue. When True it is committed as a failed line."""
    give_up_code: str | None = None
    """Set when the workflow gives up on a line without sending it (e.g. it was lost too many
    times): commit an error record with this code unless a record already exists."""
    give_up_message: str | None = None
    priority: int | None = None
    """vLLM `priority` to put in the body (the route's priority hint; None: leave it)."""
    timeout_seconds: float | None = None
    """The whole exchange's deadline, chosen by the workflow (which sizes the activity's
    start-to-close timeout from the same number). None: the worker's setting (lines scheduled
    before this field existed)."""
    workspace: str | None = None
    """The batch's workspace (identity snapshot), for the usage journal."""
    key_id: str | None = None
    """The id of the key that created the batch (identity snapshot), for the usage journal."""
    preemptions: int = 0
    """Times this line was preempted before (preemptive yield: the worker lets it run to the
    end once it reaches the route's `max_preemptions`)."""


class LineOutcome(BaseModel):
    line: int
    """0-based line number in the batch's request lines."""
    ok: bool = False
    """2xx and committed."""
    retry: bool = False
    """Not committed: rate limited / unavailable / refused; send it again later."""
    retry_after: float | None = None
    """With `retry`: the upstream's Retry-After, in seconds."""
    status_code: int | None = None
    error_code: str | None = None
    usage: TokenCounts | None = None
    preempted: bool = False
    """Not committed: ended early to give its seat to live traffic; run it again, first in the
    queue, without back-off and without counting a retry."""
    wasted_tokens: int = 0
    """With `preempted`: the tokens it had generated and threw away. 0 when it kept its partial
    answer for its next run (decision 0036); counted from the stream for a streamed line that
    could not keep it; else an estimate (its time upstream × the route's tokens per second per
    line on that worker; 0 before a line there completed)."""
    reprefill_tokens: int = 0
    """Tokens this run sent again as prompt to continue a kept partial answer (the first
    prompt and the partial answer, decision 0036): prefill work a restart does not repeat
    either way, mostly prefix-cache hits on vLLM. 0 for a run that did not continue one."""
    held: bool = False
    """With `preempted`: never sent, it waited at the worker's door (no seat free beside live
    traffic) as long as a run may wait (`activities.preemption.board.DOOR_LIMIT`); run it again, no
    preemption, retry or loss counted. Waiting is not a try."""


class DemandInput(BaseModel):
    """Register or update a batch's demand with a route's scheduler (signal-with-start)."""

    route_id: str
    batch_id: str
    workspace: str
    wanted: int
    epoch: int = 0
    expires_at: float | None = None
    """Passed on in the `Demand` (deadline-aware shares)."""
    line_seconds: float | None = None
    """Passed on in the `Demand` (deadline-aware shares)."""


class FinalizeInput(BaseModel):
    batch_id: str
    workspace: str
    input_file_id: str
    reason: EndReason
    output_expires_after_seconds: int | None = None
    """The batch's `output_expires_after`: its output and error files expire this long after
    they are created (None: kept until deleted)."""


class CleanupInput(BaseModel):
    """One pass of the retention cleanup (the schedule's workflow)."""


class CleanupOutput(BaseModel):
    """What one retention pass removed (and indexed)."""

    indexed_files: int = 0
    """Files given an entry in their workspace's index (written by an earlier version)."""
    deleted_files: int = 0
    """Files past their `expires_at`."""
    abandoned_uploads: int = 0
    """Unfinished uploads left by processes that died mid-upload (older than a day)."""
    finalized_leftovers: int = 0
    """Finalized batches whose work was found again (a line committed after finalizing, on
    the S3 store) and dropped."""
    ended_batches: int = 0
    """Batches that ended without finalizing (input rejected, the store unavailable until
    their deadline, terminated) whose stored work was dropped."""


class FinalizeOutput(BaseModel):
    output_file_id: str | None = None
    error_file_id: str | None = None
    total: int = 0
    completed: int = 0
    failed: int = 0
    usage: TokenCounts = Field(default_factory=TokenCounts)


RECORD_STRIDE = 256
"""`FinalizedFiles` keeps where every this many-th record of each assembled file starts."""


class FinalizedFiles(FinalizeOutput):
    """What finalizing records in the store (`finalized.json`): its output, and a sparse index
    of each assembled file (the byte offset of records 0, `stride`, 2 `stride`, ...), so partial
    results read a page from its cursor, not from the file's start (`api.batches.results`). Batches
    finalized before the index have None (their pages scan from the start)."""

    stride: int = RECORD_STRIDE
    output_offsets: list[int] | None = None
    error_offsets: list[int] | None = None


class ClosedBatchesInput(BaseModel):
    batch_ids: list[str]


class ClosedBatchesOutput(BaseModel):
    closed: list[str] = Field(default_factory=list)
    missing: list[str] = Field(default_factory=list)
    """Those of `closed` Temporal does not know at all (never started, or gone)."""


# ---- batch ⇄ scheduler signals ----
class Demand(BaseModel):
    batch_id: str
    workspace: str
    wanted: int
    """Lines not yet finished that the batch would run now (running + startable). 0 = leaving."""
    epoch: int = 0
    """The last allotment epoch the batch saw: a re-registered batch continues from it, so its
    next allotment is never mistaken for a stale one."""
    weight: int = 1
    """Share weight of the batch's workspace (from the config when the demand is sent)."""
    expires_at: float | None = None
    """When the batch expires (Unix seconds): with `line_seconds`, the scheduler can tell a
    batch whose fair share would not finish in time (deadline-aware shares, decision 0038).
    None: not said (older batches)."""
    line_seconds: float | None = None
    """Mean seconds the batch's lines on this route have held a slot so far (None: no line has
    finished yet, or not said)."""


class Allotment(BaseModel):
    route_id: str
    epoch: int
    lines: int
    priority: int | None = None
    """The route's priority hint, sent in each batch line's body (None: none)."""


class Ack(BaseModel):
    """The batch's running lines are within the allotment of this epoch."""

    batch_id: str
    epoch: int
    running: int


class PauseRequest(BaseModel):
    by: str = "operator"
    """Who or what paused (shown as `paused_by`)."""
