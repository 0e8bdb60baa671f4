"""The Batch object in OpenAI's shape, plus backfill's extension fields under `backfill`.

Shared by the workflows (which build it), the activities and the api (which serve it). Plain
pydantic models: safe to import inside the workflow sandbox.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from backfill.routes.reasons import reason_text
from backfill.upstream.endpoints import (
    ENDPOINTS as ENDPOINTS,  # the batch endpoints: backfill.upstream.endpoints
)
from backfill.upstream.endpoints import Endpoint as Endpoint

BatchStatus = Literal[
    "validating",
    "failed",
    "in_progress",
    "finalizing",
    "completed",
    "expired",
    "cancelling",
    "cancelled",
]
TERMINAL_STATUSES: frozenset[str] = frozenset({"failed", "completed", "expired", "cancelled"})

CompletionWindow = Literal["24h", "48h", "72h", "168h"]
COMPLETION_WINDOWS: dict[str, int] = {
    w: int(w.removesuffix("h")) for w in get_args(CompletionWindow)
}
"""Accepted completion windows and their length in hours."""


class _Wire(BaseModel):
    """Served as is by the api: every field is always sent (`null` included), so the JSON schema
    marks fields with defaults as required too."""

    model_config = ConfigDict(json_schema_serialization_defaults_required=True)


class BatchError(_Wire):
    """One entry of OpenAI's `errors.data` list (why validation failed)."""

    code: str
    message: str
    line: int | None = None
    """1-based line number in the input file, where the error is about one line."""
    param: str | None = None


class BatchErrors(_Wire):
    object: Literal["list"] = "list"
    data: list[BatchError] = Field(default_factory=list)


class RequestCounts(_Wire):
    total: int = 0
    completed: int = 0
    failed: int = 0


class InputTokensDetails(_Wire):
    cached_tokens: int = 0


class OutputTokensDetails(_Wire):
    reasoning_tokens: int = 0


class Usage(_Wire):
    input_tokens: int = 0
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: int = 0
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int = 0

    def add(self, other: TokenCounts) -> None:
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.total_tokens += other.total_tokens
        self.input_tokens_details.cached_tokens += other.cached_tokens
        self.output_tokens_details.reasoning_tokens += other.reasoning_tokens


class TokenCounts(BaseModel):
    """Token usage of one line (or a sum of lines), as reported by the upstream."""

    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0

    def add(self, other: TokenCounts) -> None:
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.total_tokens += other.total_tokens
        self.cached_tokens += other.cached_tokens
        self.reasoning_tokens += other.reasoning_tokens


class RouteProgress(_Wire):
    """Per model/route state of a batch (extension field)."""

    model: str
    route: str
    state: str
    """`running`, `queued`, `paused`, `done`."""
    reason: str | None = None
    reason_detail: str | None = None
    """What the route's closed gate adds to `reason`: for `Held for maintenance`, `until` the
    hold's end (ISO 8601). Said with the reason by `backfill.routes.reasons.reason_text`."""
    queue_position: int | None = None
    running_lines: int = 0
    allotment: int = 0
    total_lines: int = 0
    finished_lines: int = 0
    preempted_lines: int = 0
    """Runs of the batch's lines on this route ended early to give their seat to live traffic
    (preemptive yield); each line ran again."""
    wasted_tokens: int = 0
    """Tokens those runs had generated, thrown away (an estimate; 0 for a run whose partial
    answer was kept for the next to continue, decision 0036)."""
    reprefill_tokens: int = 0
    """Tokens the runs that continued a kept partial answer sent again as prompt (the first
    prompt and the partial answer): not billed, counted for the operator."""

    def shown_reason(self) -> str | None:
        """The reason with its detail (`reason_text`); None when nothing holds lines back."""
        return reason_text(self.reason, self.reason_detail) if self.reason else None


class SubmitEstimate(_Wire):
    """The estimate made when the batch was created (`backfill.batches.submit_estimate`): when it
    should finish and whether its window looks achievable, from its routes' recent spare throughput
    (per hour of the week) and the work queued before it. Never updated afterwards."""

    made_at: int
    """When it was made (unix seconds: the batch's `created_at`)."""
    expected_finish_at: int | None = None
    """When the batch should finish (unix seconds); null when there is no estimate (a route
    without history, a model that could not be read) or the finish is too far to say."""
    window_achievable: bool | None = None
    """`expected_finish_at` is by `expires_at`; null when there is no estimate."""
    lines: int = 0
    """The input's lines, as counted at submit."""
    lines_ahead: int = 0
    """Lines of batches already on its routes that it shares them with before it finishes."""
    model: str | None = None
    """The model estimated for (the first line's)."""


class BackfillExtension(_Wire):
    paused: bool = False
    paused_by: str | None = None
    summary: str | None = None
    """"Queued — waiting for capacity" when lines are held back and none runs."""
    routes: list[RouteProgress] = Field(default_factory=list)
    workspace: str | None = None
    stale: bool = False
    """True when no worker could answer for the batch just now (none running): the object is
    Temporal's own record of it (status from its search attribute, the rest as created or as of
    its last continue-as-new), so counts and times may lag behind."""
    lines_per_second: float | None = None
    """Lines finished per second over the last few minutes, as the api saw them
    (`backfill.batches.eta`); None when not running or not yet known."""
    expected_finish_at: int | None = None
    """When the batch should finish at that pace (unix seconds); None when it is not moving."""
    at_risk: bool = False
    """The expected finish is after `expires_at`: at this pace some lines will expire."""
    retries: list[str] = Field(default_factory=list)
    """Batches created to retry lines of this one (their metadata `retry_of` names it)."""
    estimate: SubmitEstimate | None = None
    """The estimate at submit (null for batches created before it existed)."""
    waiting_on_store: bool = False
    """True while the batch's validation or finalizing waits for the file store to come back
    (its last attempt found the store unavailable: `backfill.batches.storage_waits`)."""


class Batch(_Wire):
    """OpenAI's Batch object; `backfill` holds our extension fields."""

    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    errors: BatchErrors | None = None
    input_file_id: str
    completion_window: str
    status: BatchStatus
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts = Field(default_factory=RequestCounts)
    metadata: dict[str, str] | None = None
    usage: Usage = Field(default_factory=Usage)
    model: str | None = None
    backfill: BackfillExtension = Field(default_factory=BackfillExtension)
