"""A route's preemptive-yield policy as its scheduler holds it (the `live_gate` query: no history).

Read by the api processes (which routes to send live counts for) and by the workers (what to do
with them): a worker takes a route's seats and bounds from its scheduler, never from a report,
so whoever can reach the channel can send counts, not policy (docs/decisions/0023).
"""

from __future__ import annotations

from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from backfill.platform import refs
from backfill.platform.ids import scheduler_workflow_id
from backfill.routes.gates.preempt import PreemptPolicy

POLICY_TTL = 5.0
"""Seconds a route's policy is reused before its scheduler is asked again (turning preemption
on or off takes effect within this)."""


async def read_preempt_policy(client: Client, route: str) -> PreemptPolicy | None:
    """The route's policy (None: preemption off, or no scheduler yet: no batch line to end).
    Any other failure (Temporal down or slow) raises: the caller keeps what it had."""
    handle = client.get_workflow_handle_for(
        refs.RouteSchedulerWorkflow.run, scheduler_workflow_id(route)
    )
    try:
        view = await handle.query(refs.RouteSchedulerWorkflow.live_gate)
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    return view.preempt
