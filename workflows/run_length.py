"""When a batch's run has grown enough to continue as new: pure, no temporalio import.

Temporal terminates a run at 51,200 history events or 50 MB. The server suggests continuing as
new well before that (dynamic config `limit.historyCount.suggestContinueAsNew`, 4,096 events by
default, and `limit.historySize.suggestContinueAsNew`, 4 MB): a batch follows the suggestion, so
an operator who raises those thresholds gets fewer, longer runs (fewer drain pauses). Longer runs
cost worker memory: at cap 64 the worker peaked at 206 MiB in runs of 15,000 events against
148 MiB in runs of 4,200 (docs/performance.md), about 5 KB per event of the run's length (a
workflow task that misses the sticky queue replays the whole run).
The bounds below are the safety net for a server whose suggestion is off or set higher: a run that
reaches either drains and continues. They sit under the server's own warning thresholds (10,240
events, 10 MB) and far under its hard limits, leaving room for the lines still running (a few
events each) and for finalizing.
"""

from __future__ import annotations

MAX_RUN_EVENTS = 10_000
"""Continue as new at this many history events even without a suggestion."""
MAX_RUN_HISTORY_BYTES = 10 * 1000 * 1000
"""Continue as new at this history size (bytes) even without a suggestion."""


def run_is_full(*, suggested: bool, events: int, size_bytes: int) -> bool:
    """Whether the run should stop starting lines, drain and continue as new: Temporal suggests
    it (history count or size past the server's thresholds) or the history reached a bound."""
    return suggested or events >= MAX_RUN_EVENTS or size_bytes >= MAX_RUN_HISTORY_BYTES
