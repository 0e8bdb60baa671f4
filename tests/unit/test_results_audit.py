"""An admin's read of another workspace's `/v1/batches/{id}/results` is audited, as every other
cross-workspace read of content is (issue 47); a read of one's own workspace is not."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from temporalio.client import WorkflowExecutionStatus
from temporalio.common import SearchAttributePair, TypedSearchAttributes

from api.batches import results
from api.deps import Identity
from backfill.batches import search_attributes as sa
from backfill.files import open_store
from backfill.platform.config import Settings
from backfill.tenancy.byte_budget import ByteBudget

ADMIN = Identity(workspace="ops", role="platform_admin", key_name="ops", key_id="key_ops")


@pytest.mark.parametrize(("owner", "audited"), [("alice", True), ("ops", False)])
async def test_reading_results_across_workspaces_is_audited(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    owner: str,
    audited: bool,
) -> None:
    async def describe(client: Any, identity: Identity, batch_id: str) -> Any:
        attrs = TypedSearchAttributes([SearchAttributePair(sa.WORKSPACE, owner)])
        return SimpleNamespace(
            status=WorkflowExecutionStatus.COMPLETED, typed_search_attributes=attrs
        )

    monkeypatch.setattr(results, "describe_batch", describe)
    store = open_store(Settings(data_dir=tmp_path))
    with caplog.at_level("INFO", logger="backfill.audit"):
        buffers = ByteBudget(1 << 20, 1 << 20)
        r = await results.batch_results("batch_x", None, store, ADMIN, buffers)  # type: ignore[arg-type]
    assert r.status_code == 200
    events = [rec.getMessage() for rec in caplog.records if rec.name == "backfill.audit"]
    if not audited:
        assert events == []
        return
    [event] = events
    for part in ("key_id=key_ops", "action=batch.results", "object=batch_x", "workspace=alice"):
        assert part in event
