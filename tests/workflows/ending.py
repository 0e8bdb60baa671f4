"""Ending a workflow a test started, whatever became of it meanwhile."""

from __future__ import annotations

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError


async def terminate_if_running(client: Client, workflow_id: str) -> None:
    """Terminate the workflow's newest run if it still runs.

    A route scheduler continues as new when Temporal suggests it, so by the end of a test the run
    the test started may have closed, and the time-skipping test server can refuse to terminate by
    id ("Completed workflow") where the dev server takes the newest run. On a refusal: ask which
    run is the newest, and end that one if it is still running."""
    try:
        await client.get_workflow_handle(workflow_id).terminate()
    except RPCError:
        described = await client.get_workflow_handle(workflow_id).describe()
        if described.status == WorkflowExecutionStatus.RUNNING:
            await client.get_workflow_handle(workflow_id, run_id=described.run_id).terminate()
