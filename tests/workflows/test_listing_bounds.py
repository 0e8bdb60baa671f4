"""Listing batches reads about one page per request, not every batch the workspace keeps
(issue 40): on the real dev server, 250 batches created over 2 hours, walked 20 at a time with
`after`, come back newest first, each exactly once, and no request reads more than a few pages'
worth of visibility rows."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from temporalio.client import Client, WorkflowExecution
from temporalio.common import SearchAttributePair, TypedSearchAttributes

from api.batches import reads as batch_reads
from api.errors import InvalidRequest
from backfill.batches import search_attributes as sa
from backfill.batches.batch import Batch
from backfill.platform.messages import BatchInput
from tests.polling import poll_until

N, LIMIT, SPACING = 250, 20, 27
"""Batches, page size, seconds between two batches' creation."""


class _CountingClient:
    """The real client; the visibility rows it hands out are counted."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self.rows = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def list_workflows(self, *args: Any, **kwargs: Any) -> AsyncIterator[WorkflowExecution]:
        rows = self._client.list_workflows(*args, **kwargs)

        async def counted() -> AsyncIterator[WorkflowExecution]:
            async for ex in rows:
                self.rows += 1
                yield ex

        return counted()


async def _listed(client: Client, batch_id: str, statuses: Any = None) -> Batch:
    """The page's batches by id only: what is measured here is the reading of rows."""
    return Batch(
        id=batch_id,
        endpoint="/v1/chat/completions",
        input_file_id="",
        completion_window="24h",
        status="in_progress",
        created_at=0,
    )


async def test_pages_read_about_a_page_each(
    temporal_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(batch_reads, "load_or_stub", _listed)
    workspace = f"list-{uuid.uuid4().hex[:8]}"
    queue = f"tq-list-{workspace}"  # no worker: the batches just stay running
    newest = int(time.time()) - 60
    # Ids as the api issues them (letters and digits after `batch_`), as `after` must be.
    tag = workspace.removeprefix("list-")
    made = [(newest - (N - 1 - i) * SPACING, f"batch_list{tag}{i:04d}") for i in range(N)]

    async def start(created: int, batch_id: str) -> Any:
        return await temporal_client.start_workflow(
            "BatchWorkflow",
            BatchInput(
                batch_id=batch_id,
                workspace=workspace,
                input_file_id="file-x",
                endpoint="/v1/chat/completions",
                completion_window="24h",
                created_at=created,
            ),
            id=batch_id,
            task_queue=queue,
            search_attributes=TypedSearchAttributes(
                [
                    SearchAttributePair(sa.WORKSPACE, workspace),
                    SearchAttributePair(sa.CREATED_AT, created),
                ]
            ),
        )

    handles: list[Any] = []
    try:
        for i in range(0, N, 50):
            handles += await asyncio.gather(*(start(*m) for m in made[i : i + 50]))
        expected = [b for _, b in sorted(made, reverse=True)]
        filters = f"{sa.WORKSPACE.name} = '{workspace}'"

        async def visible() -> int:
            return (await temporal_client.count_workflows(filters)).count

        await poll_until(visible, lambda n: n == N, timeout=60, what="every batch visible")

        counting = _CountingClient(temporal_client)
        seen: list[str] = []
        most = 0
        after = None
        while True:
            counting.rows = 0
            page = await batch_reads.list_page(
                counting,  # type: ignore[arg-type]
                filters,
                after=after,
                limit=LIMIT,
            )
            most = max(most, counting.rows)
            seen += [b.id for b in page.data]
            if not page.has_more:
                break
            after = page.last_id
        assert seen == expected  # newest first, each once
        # A page reads at most two windows of 4 x (limit + 1) rows, plus its cursor's own row.
        assert most <= 2 * 4 * (LIMIT + 1) + 1, most
        with pytest.raises(InvalidRequest):
            await batch_reads.list_page(temporal_client, filters, after="batch_nope", limit=LIMIT)
    finally:
        for i in range(0, len(handles), 50):
            await asyncio.gather(*(h.terminate("test over") for h in handles[i : i + 50]))
