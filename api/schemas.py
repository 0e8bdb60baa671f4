"""The api's request and response models: what `/openapi.json` and `/docs` describe.

Responses keep OpenAI's wire shape: every field is always sent, `null` where OpenAI sends `null`
(never `response_model_exclude_none`), so the `openai` SDK parses them as it parses OpenAI's.
The Batch object itself is `backfill.batches.batch.Batch`, shared with the workflows that build it.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Annotated, Any, Generic, Literal, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from backfill.batches.batch import Batch, CompletionWindow, Endpoint
from backfill.batches.jobs import Job
from backfill.files import FileObject as StoredFile
from backfill.routes.settings import RouteSettings, SettingSource
from backfill.routes.status import RouteState

MAX_METADATA_PAIRS = 16

_Output = ConfigDict(
    json_schema_serialization_defaults_required=True, use_attribute_docstrings=True
)
"""Response models: a field with a default is still always sent, so the schema marks it required;
attribute docstrings become the fields' descriptions in `/docs`."""


# ---- errors ------------------------------------------------------------------------------------


class ErrorDetail(BaseModel):
    model_config = _Output

    message: str
    """What went wrong, for a human."""
    type: str
    """`invalid_request_error`, `permission_error` or `server_error`."""
    param: str | None = None
    """The request parameter at fault, if one is."""
    code: str | None = None
    """A stable machine-readable code where there is one (`file_not_found`, `read_only`, ...)."""


class ErrorResponse(BaseModel):
    """OpenAI's error envelope: every non-2xx answer of `/v1` and `/api/v1` has this shape."""

    model_config = _Output

    error: ErrorDetail


_ERROR_DESCRIPTIONS = {
    400: "Invalid request: a parameter, the body or a query parameter is wrong",
    401: "Missing or unknown API key",
    403: "The key's role may not do this",
    404: "No such object (or another workspace's)",
    409: "The object's status does not allow this",
    413: "The upload is larger than the configured cap",
    429: "A workspace limit (active batches, stored bytes, live requests in flight) is reached",
    500: "Unexpected server error",
    503: "A dependency (Temporal) is unavailable",
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` entries documenting these error statuses with the envelope model.

    Validation errors are answered 400 in the envelope, never FastAPI's 422 `{"detail": ...}`."""
    return {s: {"model": ErrorResponse, "description": _ERROR_DESCRIPTIONS[s]} for s in statuses}


COMMON_ERRORS: dict[int | str, dict[str, Any]] = {
    **error_responses(400, 401, 500),
    "4XX": {"model": ErrorResponse, "description": "Any other client error, in the same envelope"},
}
"""Every authenticated route can answer these. Documenting `4XX` also keeps FastAPI from
documenting its default 422 `{"detail": ...}`, which this api never sends."""


# ---- files -------------------------------------------------------------------------------------


class FileObject(BaseModel):
    """OpenAI's File object (the owner workspace stays internal)."""

    model_config = _Output

    id: str
    bytes: int
    """Size in bytes."""
    created_at: int
    """Unix seconds."""
    filename: str
    purpose: str
    """`batch` for uploads, `batch_output` for a batch's output and error files."""
    object: Literal["file"] = "file"
    status: Literal["uploaded", "processed", "error"] = "processed"
    expires_at: int | None = None
    status_details: str | None = None

    @classmethod
    def of(cls, stored: StoredFile) -> FileObject:
        return cls.model_validate(stored.model_dump(exclude={"workspace"}))


Item = TypeVar("Item")
_id = attrgetter("id")


class ListPage(BaseModel, Generic[Item]):
    """One page of a listing, OpenAI's way: its objects, the first and last ids (`after` for
    the next page) and whether more follow. Every listing's model is one of these."""

    model_config = _Output

    object: Literal["list"] = "list"
    data: list[Item]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool

    @classmethod
    def of(cls, data: list[Item], *, has_more: bool, last_id: str | None = None) -> Self:
        """The page of these objects (each has an `id`). `last_id`: the next page's `after`
        when it is not the last object's id (a job listing's page that ended early)."""
        return cls(
            data=data,
            first_id=_id(data[0]) if data else None,
            last_id=last_id or (_id(data[-1]) if data else None),
            has_more=has_more,
        )


class FileList(ListPage[FileObject]):
    pass


class FileDeleted(BaseModel):
    model_config = _Output

    id: str
    object: Literal["file"] = "file"
    deleted: bool


UPLOAD_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file", "purpose"],
                    "properties": {
                        "file": {"type": "string", "format": "binary"},
                        "purpose": {"type": "string", "enum": ["batch"]},
                    },
                }
            }
        },
    }
}
"""`POST /v1/files`'s body, streamed by `api.files.upload` rather than declared as parameters."""


# ---- batches -----------------------------------------------------------------------------------

MetadataKey = Annotated[str, StringConstraints(max_length=64)]
MetadataValue = Annotated[str, StringConstraints(max_length=512)]


class ExpiresAfter(BaseModel):
    """OpenAI's `{"anchor": "created_at", "seconds": 3600..2592000}`."""

    anchor: Literal["created_at"]
    seconds: int = Field(ge=3600, le=30 * 86400)


class CreateBatch(BaseModel):
    """`POST /v1/batches`. Unknown fields are ignored."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    input_file_id: str = Field(min_length=1)
    """An uploaded file of purpose `batch`, in the caller's workspace."""
    endpoint: Endpoint
    completion_window: CompletionWindow
    metadata: dict[MetadataKey, MetadataValue] | None = Field(
        default=None, max_length=MAX_METADATA_PAIRS
    )
    """Up to 16 pairs; keys of at most 64 characters, string values of at most 512; the key
    `backfill_job` is reserved (it marks a single job, `/gateway/v1/batches`)."""
    output_expires_after: ExpiresAfter | None = None
    """OpenAI's expiration policy for the output and error files (default: kept until deleted)."""


class BatchList(ListPage[Batch]):
    pass


# ---- management API: batch scheduling ----------------------------------------------------------


class PreemptChannelStatus(BaseModel):
    """The workers preemptive yield's channel knows of and reaches, from one api process."""

    model_config = _Output

    workers_found: int
    """Activity workers polling the task queue now (or listed in
    `BACKFILL_PREEMPT_WORKER_URLS`)."""
    workers_reached: int
    """Those whose last live count was taken: 0 with `preempt` set means no line is preempted."""


class SchedulingStatus(RouteState):
    """The route's state as its scheduler says it (`RouteState`, every field as the scheduler
    answered it), with what the batches and this api process add."""

    model_config = _Output

    running_lines: int
    """Batch lines running on the route now, counted by the batches themselves."""
    preempted_lines: int = 0
    """Runs of batch lines ended early to give their seat to live traffic (preemptive yield),
    summed over the batches now on the route (each batch's `backfill.routes[]` entry)."""
    wasted_tokens: int = 0
    """Tokens those runs had generated, thrown away (an estimate), summed the same way. 0 for
    a run that kept its partial answer for the next to continue (decision 0036)."""
    reprefill_tokens: int = 0
    """Tokens the runs that continued a kept partial answer sent again as prompt (the first
    prompt and the partial answer: mostly prefix-cache hits on vLLM), summed the same way."""
    preempt_channel: PreemptChannelStatus | None = None
    """Preemptive yield's channel as this api process sees it (null: off, no
    `BACKFILL_PREEMPT_TOKEN`: a `preempt` setting then preempts nothing)."""
    stale: bool = False
    """True when the scheduler could not answer just now (no worker running): the settings are
    Temporal's record of them (its input and the updates it accepted), the counts are unknown
    (zero) and `batches` is empty."""


class BatchScheduling(BaseModel):
    """`/api/v1/platform/deployments/{id}/batch-scheduling`: a route's settings and status."""

    model_config = _Output

    route: str
    settings: RouteSettings
    """The settings document, as `PUT` takes it (the scheduler's own model)."""
    sources: dict[str, SettingSource] = Field(default_factory=dict)
    """Where each setting came from: `config` (the route's `settings` table in the config file,
    or its `max_concurrent_lines`), `admin_api` (a `PUT`, or the console's form) or `default`.
    Which wins when: docs/decisions/0039."""
    status: SchedulingStatus


# ---- single jobs (/gateway/v1/batches) ------------------------------------------------------


class CreateJob(BaseModel):
    """`POST /gateway/v1/batches`: one request, run durably as a one-line batch. Unknown
    fields are ignored."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    path: Endpoint
    """The endpoint to send the request to."""
    body: dict[str, Any]
    """The request body, as that endpoint takes it (with `model`; no streaming)."""
    completion_window: CompletionWindow = "24h"
    """How long the job may wait for capacity before it ends `failed` (`batch_expired`)."""
    metadata: dict[MetadataKey, MetadataValue] | None = Field(
        default=None, max_length=MAX_METADATA_PAIRS - 1
    )
    """Up to 15 pairs (the batch's 16th marks it a job): keys of at most 64 characters, string
    values of at most 512; the key `backfill_job` is reserved."""


class JobList(ListPage[Job]):
    pass


class JobIdentity(BaseModel):
    """Who created a job: its batch's identity snapshot (never the key itself)."""

    model_config = _Output

    workspace: str
    key_id: str | None = None
    """The id of the key that created it (`backfill keys create`); null for a key without
    one."""
    role: str | None = None
    """That key's role when the job was created."""
    allowed_models: list[str] | None = None
    """The models that key could use (null: every model); the job runs under this to the end."""


class AdminJob(Job):
    """A job as the admin endpoints (`/gateway/ui-api/batches`) show it: the Job, its
    workspace and its creator's identity snapshot."""

    workspace: str
    identity: JobIdentity


class AdminJobList(ListPage[AdminJob]):
    pass


__all__ = [
    "AdminJob",
    "AdminJobList",
    "Batch",
    "BatchList",
    "BatchScheduling",
    "COMMON_ERRORS",
    "CreateBatch",
    "CreateJob",
    "ErrorResponse",
    "FileDeleted",
    "FileList",
    "FileObject",
    "Job",
    "JobIdentity",
    "JobList",
    "SchedulingStatus",
    "error_responses",
]
