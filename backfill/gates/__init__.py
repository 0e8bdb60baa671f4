"""A route's gates, pure: may a new batch line start on the route now, and if not, why.

One module per gate (`window`, `backoff`, `live`, `server_load`, `seats`, `preempt`, `ramp`),
each holding its settings model, its decision and its registry entry; `base` says what a gate
is; `registry` lists them in order and derives the scheduler's combined decision (`route_gate`,
then `ramped`), the gates' fields of the route settings document and the console's rows. No
temporalio import: `RouteSchedulerWorkflow` passes `workflow.now()` and its recorded state in
and acts on the answer (import this package inside `workflow.unsafe.imports_passed_through()`:
the time window reads `zoneinfo`).
"""

from backfill.gates.base import GateAnswer, GateContext, GateEntry
from backfill.gates.registry import GATES, SETTINGS_GATES, Gate, ramped, route_gate

__all__ = [
    "GATES",
    "SETTINGS_GATES",
    "Gate",
    "GateAnswer",
    "GateContext",
    "GateEntry",
    "ramped",
    "route_gate",
]
