"""Pausing or resuming a single job its batch no longer allows answers the jobs API's own code,
`invalid_job_state` (issue 39: a finalizing job answered the batches API's
`invalid_batch_status`). The job's batch is read and controlled through the batches API's
functions, replaced here."""

from __future__ import annotations

from typing import Any

import pytest

from api.batches import batches_api as batches
from api.deps import Identity
from api.errors import Conflict
from api.jobs import jobs_api as jobs
from backfill.batches.batch import Batch, RequestCounts
from backfill.batches.jobs import JOB_METADATA

ALICE = Identity(workspace="alice", role="member", key_name="alice")


def a_job(status: str, completed: int = 0) -> Batch:
    return Batch(
        id="batch_job",
        endpoint="/v1/chat/completions",
        input_file_id="file-x",
        completion_window="24h",
        status=status,  # type: ignore[arg-type]
        created_at=1,
        request_counts=RequestCounts(total=1, completed=completed, failed=0),
        metadata=dict(JOB_METADATA),
    )


@pytest.fixture
def batch_api(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The batches API as it answers a batch no longer in progress; the calls it got."""
    calls: list[str] = []

    async def refuse(batch_id: str, client: Any, identity: Identity) -> Batch:
        calls.append(batch_id)
        raise Conflict(
            "Cannot pause a batch with status 'finalizing'.", code="invalid_batch_status"
        )

    monkeypatch.setattr(batches, "pause_batch", refuse)
    monkeypatch.setattr(batches, "resume_batch", refuse)
    return calls


@pytest.mark.parametrize("action", ["pause", "resume"])
async def test_a_finalizing_job_is_an_invalid_job_state(
    monkeypatch: pytest.MonkeyPatch, batch_api: list[str], action: str
) -> None:
    async def job_batch(client: Any, identity: Identity, job_id: str) -> Batch:
        return a_job("finalizing", completed=1)

    monkeypatch.setattr(jobs, "job_batch", job_batch)
    with pytest.raises(Conflict) as err:
        await jobs.control_batch(action, "batch_job", None, ALICE)  # type: ignore[arg-type]
    assert err.value.code == "invalid_job_state"
    assert batch_api == []  # refused before the batch is asked


async def test_a_job_that_moved_on_meanwhile_is_an_invalid_job_state(
    monkeypatch: pytest.MonkeyPatch, batch_api: list[str]
) -> None:
    async def job_batch(client: Any, identity: Identity, job_id: str) -> Batch:
        return a_job("in_progress")  # read just before it finalized

    monkeypatch.setattr(jobs, "job_batch", job_batch)
    with pytest.raises(Conflict) as err:
        await jobs.control_batch("pause", "batch_job", None, ALICE)  # type: ignore[arg-type]
    assert err.value.code == "invalid_job_state"
    assert batch_api == ["batch_job"]
