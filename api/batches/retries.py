"""Retry links (extension): a batch created with metadata `retry_of` naming an earlier batch of
the same workspace carries the search attribute `BackfillRetryOf`, and the original lists its
retries (`backfill.retries`) by a visibility query on it.
Like every backfill search attribute, `BackfillRetryOf` must be registered on the namespace
(docs/operator-guide.md); where it is not, no retries are listed, and a create that links one
answers 503 `search_attribute_missing` naming it (api/errors.py)."""

from __future__ import annotations

import logging

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from api.deps import Identity
from backfill.batches import search_attributes as sa

log = logging.getLogger(__name__)

RETRY_OF_KEY = "retry_of"
MAX_LISTED = 100
"""Retries listed on one batch (the oldest first)."""


async def retry_link(
    client: Client, identity: Identity, metadata: dict[str, str] | None
) -> str | None:
    """The batch id to link a new batch to, or None: `retry_of` must name a batch that exists
    in the caller's own workspace (anything else is just metadata)."""
    original = (metadata or {}).get(RETRY_OF_KEY)
    if not original or not original.startswith("batch_"):
        return None
    try:
        desc = await client.get_workflow_handle(original).describe()
    except RPCError as err:
        if err.status in (RPCStatusCode.NOT_FOUND, RPCStatusCode.INVALID_ARGUMENT):
            return None
        raise
    if desc.workflow_type != "BatchWorkflow":
        return None
    if desc.typed_search_attributes.get(sa.WORKSPACE) != identity.workspace:
        return None
    return original


async def retries_of(client: Client, batch_id: str) -> list[str]:
    """The batches linked as retries of this one, oldest first."""
    query = f"WorkflowType = 'BatchWorkflow' AND {sa.RETRY_OF.name} = '{sa.quote(batch_id)}'"
    found: dict[str, int] = {}
    try:
        async for ex in client.list_workflows(query, page_size=MAX_LISTED):
            if ex.status == WorkflowExecutionStatus.CONTINUED_AS_NEW:
                continue
            found[ex.id] = int(ex.typed_search_attributes.get(sa.CREATED_AT) or 0)
            if len(found) >= MAX_LISTED:
                break
    except RPCError as err:
        if err.status != RPCStatusCode.INVALID_ARGUMENT:  # not registered on this namespace
            raise
        log.debug("retries of %s not listed: %s", batch_id, err)
        return []
    return sorted(found, key=lambda i: (found[i], i))
