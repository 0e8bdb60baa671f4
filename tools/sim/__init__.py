"""`backfill sim`: a vLLM-like model server for the demo, the tests and the benchmarks.

It speaks HTTP like vLLM (OpenAI-compatible endpoints, `/metrics`), with a capacity model and
fault injection (`tools.sim.faults`). Tooling, not part of the gateway's core.
"""

from tools.sim.faults import FaultAction, FaultInjector, SimFault
from tools.sim.gpu import GpuConfig, GpuEngine, LatencyRecord
from tools.sim.run import SimServer, main
from tools.sim.server import BATCH_HEADER, SimApp, SimConfig, create_app
from tools.sim.stats import Scheduler, SeenRequest, SimStats

__all__ = [
    "BATCH_HEADER",
    "FaultAction",
    "FaultInjector",
    "GpuConfig",
    "GpuEngine",
    "LatencyRecord",
    "Scheduler",
    "SeenRequest",
    "SimApp",
    "SimConfig",
    "SimFault",
    "SimServer",
    "SimStats",
    "create_app",
    "main",
]
