"""Cancel racing the batch's own end: the update lands on a workflow that has just completed
("workflow execution already completed", NOT_FOUND). Found by tests/e2e/test_fuzz_api.py as a
500 once in a CI run; the answer is the 409 a cancel of an ended batch gets."""

from __future__ import annotations

from typing import Any

import pytest
from temporalio.service import RPCError, RPCStatusCode

from api.batches import batches_api as batches
from api.deps import Identity
from api.errors import Conflict


class Handle:
    def __init__(self, err: Exception) -> None:
        self.err = err

    async def execute_update(self, *args: Any, **kwargs: Any) -> Any:
        raise self.err


class Client:
    def __init__(self, err: Exception) -> None:
        self.err = err

    def get_workflow_handle_for(self, *args: Any, **kwargs: Any) -> Handle:
        return Handle(self.err)


class Loaded:
    def __init__(self, status: str) -> None:
        self.status = status


@pytest.fixture
def ends_meanwhile(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first read sees the batch running, the read after the update sees it completed."""
    reads = iter(["in_progress", "completed"])

    async def describe(client: Any, identity: Identity, batch_id: str) -> Any:
        return object()

    async def load(client: Any, batch_id: str, desc: Any = None) -> Loaded:
        return Loaded(next(reads))

    monkeypatch.setattr(batches, "describe_batch", describe)
    monkeypatch.setattr(batches, "load_batch", load)
    monkeypatch.setattr(batches, "workspace_of", lambda desc: "w")


MEMBER = Identity(workspace="w", role="member", key_name="k")


async def test_a_cancel_that_meets_a_batch_just_ended_is_a_409(ends_meanwhile: None) -> None:
    gone = RPCError("workflow execution already completed", RPCStatusCode.NOT_FOUND, b"")
    with pytest.raises(Conflict) as err:
        await batches.cancel_batch("batch_x", Client(gone), MEMBER)  # type: ignore[arg-type]
    assert "completed" in err.value.message and err.value.code == "invalid_batch_status"


async def test_other_rpc_errors_are_not_hidden(ends_meanwhile: None) -> None:
    down = RPCError("unavailable", RPCStatusCode.UNAVAILABLE, b"")
    with pytest.raises(RPCError):  # the app's handler answers 503 temporal_unavailable
        await batches.cancel_batch("batch_x", Client(down), MEMBER)  # type: ignore[arg-type]
