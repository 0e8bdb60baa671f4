"""Admission of batches per workspace: the contract of `AdmissionWorkflow` and its pure rules.

One admission workflow per workspace (id `admission-<workspace>`, `admission_workflow_id`) holds
a reservation for every batch of the workspace that was admitted and has not been seen closed.
The api reserves with update-with-start before it starts a batch: an update runs on the
workflow's single thread, so two api processes can never both take the last slot (decision
0020). The workflow releases a reservation when the api says the start failed, or when a
periodic check finds the batch closed (or never started, after `grace_seconds`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

ADMISSION_PREFIX = "admission-"


def admission_workflow_id(workspace: str) -> str:
    """The workflow id of a workspace's admission workflow (workspace names are id-safe)."""
    return f"{ADMISSION_PREFIX}{workspace}"


class Reservation(BaseModel):
    """One admitted batch, held until the batch is seen closed."""

    batch_id: str
    input_file_id: str
    input_bytes: int = Field(ge=0)
    """Bytes of the batch's input: its pinned copy stays stored while the batch runs, also
    after the uploaded file is deleted (counted in the workspace's stored bytes)."""
    lines: int = Field(ge=0)
    """Lines of the input (counted towards `max_queued_lines`)."""
    reserved_at: float
    """When it was reserved (workflow time, epoch seconds)."""


class ReserveRequest(BaseModel):
    """Reserve a slot for one batch about to be started, under the workspace's limits (the
    api reads them from its config; the workflow reads no config)."""

    batch_id: str
    input_file_id: str
    input_bytes: int = Field(ge=0)
    lines: int = Field(ge=0)
    max_active_batches: int | None = None
    """Most batches held at once (None: no limit)."""
    max_queued_lines: int | None = None
    """Most lines of held batches, together (None: no limit)."""


class ReserveResult(BaseModel):
    accepted: bool
    active: int
    """Batches held, after this decision."""
    lines: int
    """Lines of the batches held, after this decision."""
    refused_by: Literal["max_active_batches", "max_queued_lines", "released"] | None = None
    """The limit that refused it (None when accepted); `released`: the api released this batch
    before its update was decided (it had answered the create 503)."""


class ReleaseRequest(BaseModel):
    """Drop a reservation (the batch never started). Also sent when the api gave up waiting for
    the reserve: the batch id is remembered (`released`), so that update, decided later, is
    refused."""

    batch_id: str


class AdmissionInput(BaseModel):
    workspace: str
    check_seconds: float = Field(default=30.0, gt=0)
    """How often held batches are checked (describe) for having closed."""
    grace_seconds: float = Field(default=60.0, gt=0)
    """A reservation younger than this whose batch Temporal does not know yet is kept: its batch
    may be about to start (`to_drop`)."""
    reservations: list[Reservation] = Field(default_factory=list)
    """Carried across continue-as-new."""
    released: list[str] = Field(default_factory=list)
    """Batch ids released, newest last (at most `RELEASED_KEPT`), carried across continue-as-new."""


class AdmissionView(BaseModel):
    """What the admission workflow holds now (query)."""

    reservations: list[Reservation] = Field(default_factory=list)


RELEASED_KEPT = 1000
"""Released batch ids remembered: more than the updates Temporal keeps in flight per workflow."""


def decide(
    held: list[Reservation], req: ReserveRequest, released: frozenset[str] = frozenset()
) -> ReserveResult:
    """Accept `req` when it fits under both limits with what is `held`. A batch already held is
    accepted again as it is (an update retried after a lost answer); one already `released` is
    refused (the api gave up on it and answered its create 503)."""
    active = len(held)
    lines = sum(r.lines for r in held)
    if any(r.batch_id == req.batch_id for r in held):
        return ReserveResult(accepted=True, active=active, lines=lines)
    if req.batch_id in released:
        return ReserveResult(accepted=False, active=active, lines=lines, refused_by="released")
    if req.max_active_batches is not None and active + 1 > req.max_active_batches:
        return ReserveResult(
            accepted=False, active=active, lines=lines, refused_by="max_active_batches"
        )
    if req.max_queued_lines is not None and lines + req.lines > req.max_queued_lines:
        return ReserveResult(
            accepted=False, active=active, lines=lines, refused_by="max_queued_lines"
        )
    return ReserveResult(accepted=True, active=active + 1, lines=lines + req.lines)


def remember_released(released: list[str], batch_id: str) -> list[str]:
    """`released` with `batch_id` added last, the oldest dropped past `RELEASED_KEPT`."""
    kept = [b for b in released if b != batch_id] + [batch_id]
    return kept[-RELEASED_KEPT:]


def due_for_check(held: list[Reservation], now: float, grace_seconds: float) -> list[str]:
    """The batches whose closing may be checked at `now`: those reserved at least
    `grace_seconds` ago (a younger one may not have started yet, and would look closed)."""
    return [r.batch_id for r in held if now - r.reserved_at >= grace_seconds]


def to_drop(
    held: list[Reservation],
    closed: list[str],
    missing: list[str],
    now: float,
    grace_seconds: float,
) -> list[str]:
    """The reservations a check frees: those whose batch is `closed`, except a batch Temporal
    does not know yet (`missing`) reserved less than `grace_seconds` ago (its start may be on
    its way). A batch that ran and ended is freed at the first check after its end, however
    young its reservation."""
    young = {r.batch_id for r in held if now - r.reserved_at < grace_seconds}
    absent = set(missing)
    return [b for b in closed if not (b in absent and b in young)]


def pinned_bytes(held: list[Reservation], stored_file_ids: set[str]) -> int:
    """Bytes of the held batches' pinned inputs not already counted as a stored file: an input
    whose uploaded file was deleted still takes its bytes until its batch ends. Each input is
    counted once, however many batches use it."""
    seen: dict[str, int] = {}
    for r in held:
        if r.input_file_id not in stored_file_ids:
            seen[r.input_file_id] = r.input_bytes
    return sum(seen.values())
