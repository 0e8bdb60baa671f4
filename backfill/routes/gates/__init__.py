"""A route's gates, pure: may a new batch line start on the route now, and if not, why.

One module per gate (`registry.GATES` lists them, in the order they are checked), each holding
its whole life in its registry entry: its settings model, its state and the signals that change
it, its reader activity, its decision, its shaping of the combined answer and its status
fields; `base` says what a gate is; `registry` lists them in order and derives what the route
scheduler runs (docs/decisions/0040), the gates' fields of the route settings document and the
console's rows. No temporalio import: `RouteSchedulerWorkflow` passes
`workflow.now()` and its recorded state in and acts on the answer (import this package inside
`workflow.unsafe.imports_passed_through()`: the time window reads `zoneinfo`).
"""

from backfill.routes.gates.base import (
    Gate,
    GateAnswer,
    GateContext,
    GateEntry,
    GateSignal,
    GateState,
    Reader,
)
from backfill.routes.gates.ramp import ramped
from backfill.routes.gates.registry import GATES, SETTINGS_GATES, registered, route_gate

__all__ = [
    "GATES",
    "SETTINGS_GATES",
    "Gate",
    "GateAnswer",
    "GateContext",
    "GateEntry",
    "GateSignal",
    "GateState",
    "Reader",
    "ramped",
    "registered",
    "route_gate",
]
