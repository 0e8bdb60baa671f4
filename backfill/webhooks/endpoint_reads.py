"""Reading a workspace's webhook endpoints made through the api from their workflow
(`WebhookEndpointsWorkflow`), for the api's listings and the worker's deliveries.

A workspace in which no endpoint was ever made has no such workflow, which is the usual case.
The workflow is described first (not traced): a query of a workflow that does not exist fails,
and the client's tracing marks its `QueryWorkflow:endpoints` span an ERROR, so every batch's
end trace held an error for a normal absence."""

from __future__ import annotations

from datetime import timedelta

from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from backfill.platform import refs
from backfill.webhooks.events import WebhookEndpoint, endpoints_workflow_id


async def endpoints_made(
    client: Client, workspace: str, rpc_timeout: timedelta | None = None
) -> list[WebhookEndpoint]:
    """The workspace's endpoints made through the api; [] when none was ever made. Other RPC
    errors are raised."""
    handle = client.get_workflow_handle_for(
        refs.WebhookEndpointsWorkflow.run, endpoints_workflow_id(workspace)
    )
    try:
        await handle.describe(rpc_timeout=rpc_timeout)
        return await handle.query(refs.WebhookEndpointsWorkflow.endpoints, rpc_timeout=rpc_timeout)
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:  # no endpoint was ever made
            return []
        raise
