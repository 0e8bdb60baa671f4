"""The retention activity: index files an earlier version wrote without an entry in their
workspace's index (`Store.index_files`), delete files whose `expires_at` has passed, drop
uploads that processes died in the middle of (unfinished for `ABANDONED_UPLOAD_SECONDS`), and
drop work left under finalized batches (`Store.drop_finalized_leftovers`).

A batch's own working data (pinned input, line index, per-line results) is dropped by
finalizing; an input file expiring under a running batch takes nothing from it, because the
batch reads its pinned copy (a hard link, or an S3 copy)."""

from __future__ import annotations

import asyncio
import logging
import time

from temporalio import activity

from backfill.messages import CleanupInput, CleanupOutput
from backfill.store import ABANDONED_UPLOAD_SECONDS, Store, has_expired

log = logging.getLogger(__name__)


class RetentionActivities:
    def __init__(self, store: Store) -> None:
        self.store = store

    @activity.defn
    async def delete_expired_files(self, input: CleanupInput) -> CleanupOutput:
        return await asyncio.to_thread(self._delete_expired, int(time.time()))

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
