"""Watching a batch until it ends: a live progress bar on a terminal, one plain line per change
otherwise (CI logs). Lines per second and the ETA come from what this client observed
(`backfill.batches.eta`), so they work against any OpenAI-compatible server; backfill's extension
adds why lines wait and whether the batch is at risk of expiring."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from openai.types import Batch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn
from rich.table import Column

from backfill.batches.eta import ProgressLog, Sample, estimate
from backfill.routes.reasons import reason_text

TERMINAL = ("completed", "failed", "expired", "cancelled")
PLAIN_EVERY_SECONDS = 5.0
"""Without a terminal, counts are printed at most this often (a new status at once)."""


@dataclass(frozen=True)
class View:
    """What one look at a batch shows."""

    batch_id: str
    status: str
    total: int
    completed: int
    failed: int
    lines_per_second: float | None
    eta_seconds: float | None
    reason: str
    at_risk: bool

    @property
    def finished(self) -> int:
        return self.completed + self.failed

    def rate_text(self) -> str:
        return (
            "— lines/s" if self.lines_per_second is None else f"{self.lines_per_second:.1f} lines/s"
        )

    def eta_text(self) -> str:
        if self.status in TERMINAL:
            return "done"
        if self.eta_seconds is None:
            return "ETA —"
        s = int(self.eta_seconds)
        return f"ETA {s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"

    def line(self) -> str:
        """The plain-text form."""
        parts = [
            f"{self.batch_id} {self.status}",
            f"{self.finished}/{self.total} done ({self.completed} completed, {self.failed} failed)",
            self.rate_text(),
            self.eta_text(),
        ]
        if self.at_risk:
            parts.append("at risk of expiring")
        if self.reason:
            parts.append(self.reason)
        return " · ".join(parts)


def extension(batch: Batch) -> dict[str, Any]:
    ext = (batch.model_extra or {}).get("backfill")
    return ext if isinstance(ext, dict) else {}


def wait_reason(batch: Batch) -> str:
    """backfill's word on why lines wait: paused, else each route's reason, else its summary."""
    ext = extension(batch)
    if batch.status in TERMINAL:
        return ""
    if ext.get("paused"):
        return f"Paused by {ext.get('paused_by') or 'an operator'}"
    reasons = [
        f"{r.get('model') or r.get('route')}: {reason_text(r['reason'], r.get('reason_detail'))}"
        for r in ext.get("routes") or []
        if isinstance(r, dict) and r.get("reason")
    ]
    return "; ".join(reasons) or str(ext.get("summary") or "")


def view_of(batch: Batch, log: ProgressLog, now: float) -> View:
    counts = batch.request_counts
    total = counts.total if counts else 0
    completed = counts.completed if counts else 0
    failed = counts.failed if counts else 0
    rate: float | None = None
    eta: float | None = None
    if batch.status == "in_progress":
        samples = log.add(batch.id, Sample(now, completed + failed))
        est = estimate(
            samples,
            total=total,
            now=now,
            in_progress_at=batch.in_progress_at,
            expires_at=batch.expires_at,
        )
        rate = est.lines_per_second
        if est.expected_finish_at is not None and not extension(batch).get("paused"):
            eta = max(0.0, est.expected_finish_at - now)
    return View(
        batch_id=batch.id,
        status=batch.status,
        total=total,
        completed=completed,
        failed=failed,
        lines_per_second=rate,
        eta_seconds=eta,
        reason=wait_reason(batch),
        at_risk=bool(extension(batch).get("at_risk")),
    )


class Bar:
    """The live progress bar (rich), redrawn in place."""

    def __init__(self, console: Console) -> None:
        # The status and the count are never cut (a narrow terminal showed `57/1…`): they keep
        # their width (set from the total in `show`), the texts after them wrap instead.
        self.count = MofNCompleteColumn(table_column=Column(no_wrap=True))
        self.status = TextColumn("[bold]{task.fields[status]}", table_column=Column(no_wrap=True))
        self.progress = Progress(
            self.status,
            BarColumn(bar_width=None, table_column=Column(ratio=1, min_width=5)),
            self.count,
            TextColumn(
                "· {task.fields[failed]} failed · {task.fields[rate]} · {task.fields[eta]}",
                table_column=Column(ratio=2, overflow="fold"),
            ),
            TextColumn("{task.fields[reason]}", table_column=Column(ratio=2, overflow="fold")),
            console=console,
            refresh_per_second=4,
        )
        self.task: TaskID | None = None

    def show(self, view: View) -> None:
        fields: dict[str, Any] = {
            "status": view.status,
            "failed": view.failed,
            "rate": view.rate_text(),
            "eta": view.eta_text(),
            "reason": ("[red]at risk of expiring[/] " if view.at_risk else "") + view.reason,
        }
        column = self.count.get_table_column()
        column.min_width = max(column.min_width or 0, 2 * len(str(view.total)) + 1)
        status = self.status.get_table_column()
        status.min_width = max(status.min_width or 0, len(view.status))
        if self.task is None:
            self.progress.start()
            self.progress.console.print(
                f"Watching {view.batch_id} (Ctrl-C stops watching; the batch goes on)"
            )
            self.task = self.progress.add_task("", total=view.total or None, **fields)
        self.progress.update(self.task, total=view.total or None, completed=view.finished, **fields)

    def close(self) -> None:
        if self.task is not None:
            self.progress.refresh()
        self.progress.stop()


class Lines:
    """One plain line per change, for logs; the last state is always printed at the end."""

    def __init__(self, console: Console, clock: Callable[[], float] = time.monotonic) -> None:
        self.console = console
        self.clock = clock
        self.seen: View | None = None
        self.printed: View | None = None
        self.printed_at = 0.0

    def show(self, view: View) -> None:
        self.seen = view
        last = self.printed
        changed = last is None or (view.status, view.reason) != (last.status, last.reason)
        moved = last is not None and view.finished != last.finished
        if changed or (moved and self.clock() - self.printed_at >= PLAIN_EVERY_SECONDS):
            self._print(view)

    def _print(self, view: View) -> None:
        self.console.print(view.line(), highlight=False, markup=False, soft_wrap=True)
        self.printed, self.printed_at = view, self.clock()

    def close(self) -> None:
        if self.seen is not None and self.seen != self.printed:
            self._print(self.seen)


def watch(
    retrieve: Callable[[], Batch],
    console: Console,
    interval: float,
    clock: Callable[[], float] = time.time,
) -> Batch:
    """Poll until the batch ends, showing it; the last Batch read. Ctrl-C (KeyboardInterrupt)
    goes to the caller after the display is closed."""
    display: Bar | Lines = Bar(console) if console.is_terminal else Lines(console)
    log = ProgressLog()
    try:
        while True:
            batch = retrieve()
            display.show(view_of(batch, log, clock()))
            if batch.status in TERMINAL:
                return batch
            time.sleep(interval)
    finally:
        display.close()
