"""The retention activity: index files an earlier version wrote without an entry in their
workspace's index (`Store.index_files`), delete files whose `expires_at` has passed, drop
uploads that processes died in the middle of (unfinished for `ABANDONED_UPLOAD_SECONDS`), drop
work left under finalized batches (`Store.drop_finalized_leftovers`), and drop the work of
batches that ended without finalizing (`drop_ended_work`).

A batch's own working data (pinned input, line index, per-line results, partial answers) is
dropped by finalizing; an input file expiring under a running batch takes nothing from it,
because the batch reads its pinned copy (a hard link, or an S3 copy). A batch that never
finalizes (its input rejected, the store unavailable until its deadline, its workflow
terminated) leaves its work behind: this pass drops it once Temporal says the batch's workflow
is closed (docs/decisions/0047)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from backfill.files import ABANDONED_UPLOAD_SECONDS, Store, has_expired
from backfill.platform.ids import batch_created_ms
from backfill.platform.messages import CleanupInput, CleanupOutput

log = logging.getLogger(__name__)

ENDED_GRACE_SECONDS = 3600
"""A batch younger than this keeps its work whatever Temporal says: the api pins a batch's input
before it starts the batch's workflow (and drops the pin itself when the start fails)."""
DESCRIBE_AT_ONCE = 16
"""Workflow descriptions in flight at once while looking for ended batches."""


class RetentionActivities:
    def __init__(self, store: Store, client: Client | None = None) -> None:
        self.store = store
        self.client = client
        """Temporal, to tell ended batches from running ones (None: their work is kept)."""

    @activity.defn
    async def delete_expired_files(self, input: CleanupInput) -> CleanupOutput:
        now = int(time.time())
        out = await asyncio.to_thread(self._delete_expired, now)
        if self.client is not None:
            out.ended_batches = await drop_ended_work(self.store, self._closed, now)
        return out

    def _delete_expired(self, now: int) -> CleanupOutput:
        out = CleanupOutput()
        files = self.store.list_files(None)
        out.indexed_files = self.store.index_files(files, now)
        if out.indexed_files:
            log.info("added %d files to their workspaces' indexes", out.indexed_files)
        for f in [f for f in files if has_expired(f, now)]:
            if self.store.delete_file(f.id):
                out.deleted_files += 1
                log.info("deleted expired file %s (workspace %s)", f.id, f.workspace)
        out.abandoned_uploads = self.store.drop_abandoned_uploads(now - ABANDONED_UPLOAD_SECONDS)
        if out.abandoned_uploads:
            log.info("dropped %d abandoned uploads", out.abandoned_uploads)
        out.finalized_leftovers = self.store.drop_finalized_leftovers()
        if out.finalized_leftovers:
            log.info("dropped work left under %d finalized batches", out.finalized_leftovers)
        return out

    async def _closed(self, batch_id: str) -> bool:
        """The batch's workflow (its latest run) is closed, or Temporal knows it no more."""
        assert self.client is not None
        try:
            desc = await self.client.get_workflow_handle(batch_id).describe()
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return True  # never started, or closed and past the namespace's retention
            raise
        return desc.status != WorkflowExecutionStatus.RUNNING


async def drop_ended_work(store: Store, closed: Callable[[str], Awaitable[bool]], now: int) -> int:
    """Drop the stored work of every unfinalized batch older than `ENDED_GRACE_SECONDS` whose
    workflow is `closed`; how many were dropped."""
    ids = await asyncio.to_thread(store.unfinalized_batches)
    born_before = (now - ENDED_GRACE_SECONDS) * 1000
    old = [b for b in ids if (batch_created_ms(b) or 0) < born_before]
    gate = asyncio.Semaphore(DESCRIBE_AT_ONCE)

    async def drop_if_ended(batch_id: str) -> bool:
        async with gate:
            if not await closed(batch_id):
                return False
        await asyncio.to_thread(store.drop_batch_work, batch_id)
        log.info("dropped the work of batch %s, which ended without finalizing", batch_id)
        return True

    return sum(await asyncio.gather(*(drop_if_ended(b) for b in old)))
