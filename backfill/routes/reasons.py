"""Why a route holds batch lines back: the one list of wait reasons.

Each value is the exact text the route status, a batch's `backfill.routes[].reason`, the
`gateway_batch_paused_routes{reason}` label and the console show; the values are also in saved
workflow histories, so a value never changes (a new reason is a new member).

`legitimate`: the wait is the route doing its job (a gate closed, the cap reached, the reopen
ramp growing, workers busy),
so the stalled-batch clock (`worker/stall.py`) does not count it. Not legitimate: "Server
metrics unavailable" (nothing starts because a reading fails: an operator must look).
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["LEGITIMATE_WAITS", "QUEUED_SUMMARY", "WaitReason", "reason_text"]


class WaitReason(StrEnum):
    WINDOW = "Outside its time window"
    LIVE = "Yielding to live traffic"
    BUSY = "Server busy"
    METRICS = "Server metrics unavailable"
    AT_LIMIT = "At its batch limit"
    OTHERS_TURN = "Other batches' turn"
    WORKERS_BUSY = "Gateway batch workers busy"
    BACKOFF = "Rate limited · backing off"
    SEATS = "Keeping seats free for live traffic"
    RAMP = "Ramping up after a reopen"
    MAINTENANCE = "Held for maintenance"

    @property
    def legitimate(self) -> bool:
        """Whether a batch held back for this reason is waiting, not stuck."""
        return self not in _NOT_LEGITIMATE


_NOT_LEGITIMATE = frozenset({WaitReason.METRICS})

LEGITIMATE_WAITS = frozenset(r for r in WaitReason if r.legitimate)
"""The reasons the stall clock does not count (as plain strings compare equal to them)."""

QUEUED_SUMMARY = "Queued — waiting for capacity"
"""A batch's `backfill.summary` while it has lines held back and none running."""


def reason_text(reason: str, detail: str | None = None) -> str:
    """A wait reason as every reader of a batch says it (the api's summary, the CLI, the
    console): with its gate's detail when there is one, e.g. `Held for maintenance until
    2026-12-05T02:30:00+00:00` (the hold's end)."""
    return f"{reason} {detail}" if detail else reason
