"""The estimate at submit for a batch being created (`backfill.batches.submit_estimate` decides):
the input's lines and first model, each route's batch lines served per hour from the usage journal
(`<data_dir>/usage`, every process's files), and what the batches already on each route still
want (their scheduler's `status` query). Anything it cannot read leaves the estimate empty
(`expected_finish_at` null); it never fails a create."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from collections import Counter as Tally
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from prometheus_client import Counter
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from api.batches.history_view import quick_query
from backfill.batches.batch import SubmitEstimate
from backfill.batches.submit_estimate import (
    HISTORY_WEEKS,
    HOUR,
    MINUTE,
    WEEK_HOURS,
    RouteWork,
    Served,
    split_lines,
)
from backfill.batches.submit_estimate import estimate as decide
from backfill.platform.config import Settings
from backfill.platform.ids import scheduler_workflow_id
from backfill.platform.refs import RouteSchedulerWorkflow
from backfill.upstream.endpoints import spec_of
from backfill.usage.journal import USAGE_DIR, UsageEntry

log = logging.getLogger(__name__)

LIKELY_TO_MISS = Counter(
    "gateway_batches_likely_to_miss_total",
    "Batches created whose estimate at submit finishes after their expires_at by the "
    "route's history of every hour of the window (backfill.estimate.window_achievable false).",
    ["model"],
)
REFRESH_SECONDS = 60.0
"""How long a reading of the journal serves the creates that follow (within the same hour)."""


@dataclass
class _HourFile:
    stamp: tuple[int, int]
    """(mtime_ns, size) when read."""
    served: Tally[str] = field(default_factory=Tally)
    """Route → batch lines answered 200."""
    minutes: dict[str, set[int]] = field(default_factory=dict)
    """Route → the minutes of the hour (0-59) in which one of them ended."""


class ServedHistory:
    """What each route served of batches per hour (lines, busy minutes), read from the usage
    journal: the hours of the history and the current one so far. Each hour file is
    read again only when it changed (the files of hours past change no more), so a create
    reads at most the newest files."""

    def __init__(self, data_dir: Path) -> None:
        self.dir = Path(data_dir) / USAGE_DIR
        self.files: dict[str, _HourFile] = {}
        self.lock = threading.Lock()
        self.last: tuple[float, tuple[int, int], dict[str, dict[int, Served]]] | None = None
        """When `served` last looked at the files, the directory's mtime and file count then,
        and what it found."""

    def served(self, now: float) -> dict[str, dict[int, Served]]:
        """Route → (start of hour → what it served), the hours of the history and the current
        one.
        Looked up again at most every `REFRESH_SECONDS` within an hour (a burst of creates stats
        the journal's files once), and at once when a new hour began or a file was added."""
        try:  # a file added or pruned changes both (the count, whatever the clock's grain)
            stamp = (self.dir.stat().st_mtime_ns, len(os.listdir(self.dir)))
        except FileNotFoundError:
            stamp = (0, 0)
        with self.lock:
            if self.last is not None:
                at, was, found = self.last
                same_hour = int(at) // HOUR == int(now) // HOUR
                if 0 <= now - at < REFRESH_SECONDS and same_hour and was == stamp:
                    return found
            found = self._read_all(now)
            self.last = (now, stamp, found)
            return found

    def _read_all(self, now: float) -> dict[str, dict[int, Served]]:
        current = int(now) // HOUR * HOUR
        start = current - HISTORY_WEEKS * WEEK_HOURS * HOUR
        lines: dict[str, dict[int, int]] = {}
        minutes: dict[str, dict[int, set[int]]] = {}
        seen: set[str] = set()
        for path in sorted(self.dir.glob("*.jsonl")) if self.dir.is_dir() else []:
            hour = _hour_of(path.name)
            if hour is None or not start <= hour <= current:
                continue
            seen.add(path.name)
            try:
                st = path.stat()
            except FileNotFoundError:  # pruned meanwhile
                continue
            stamp = (st.st_mtime_ns, st.st_size)
            kept = self.files.get(path.name)
            if kept is None or kept.stamp != stamp:
                kept = self.files[path.name] = _read(path, stamp)
            for route, n in kept.served.items():
                by_hour = lines.setdefault(route, {})
                by_hour[hour] = by_hour.get(hour, 0) + n
                minutes.setdefault(route, {}).setdefault(hour, set()).update(kept.minutes[route])
        for name in set(self.files) - seen:
            del self.files[name]
        return {
            route: {h: Served(n, len(minutes[route][h])) for h, n in by_hour.items()}
            for route, by_hour in lines.items()
        }


def _hour_of(name: str) -> int | None:
    try:
        hour = datetime.strptime(name.split(".", 1)[0], "%Y%m%d%H").replace(tzinfo=UTC)
    except ValueError:
        return None
    return int(hour.timestamp())


def _read(path: Path, stamp: tuple[int, int]) -> _HourFile:
    out = _HourFile(stamp)
    try:
        with path.open("rb") as f:
            for line in f:
                try:
                    e = UsageEntry.from_line(line)
                except (ValueError, TypeError):
                    continue  # a torn last line
                if e.service_class == "batch" and e.status == "200":
                    out.served[e.route] += 1
                    out.minutes.setdefault(e.route, set()).add(int(e.at) % HOUR // MINUTE)
    except FileNotFoundError:
        pass
    return out


def first_model(head: bytes, endpoint: str) -> str | None:
    """The model of the first request line in `head`, the input's beginning
    (`api.batches.input_scan.InputScan.head`); None if it cannot be read."""
    spec = spec_of(endpoint)
    if spec is None:
        return None
    for raw in head.lstrip(b"\xef\xbb\xbf").split(b"\n"):
        if raw.strip():
            try:
                body = json.loads(raw).get("body")
                model = body.get(spec.model_field) if isinstance(body, dict) else None
            except (ValueError, AttributeError):
                return None
            return model if isinstance(model, str) else None
    return None


_HISTORIES: dict[Path, ServedHistory] = {}


def history_of(data_dir: Path) -> ServedHistory:
    """The process's reader of the journal under `data_dir` (one per directory)."""
    key = Path(data_dir)
    if key not in _HISTORIES:
        _HISTORIES[key] = ServedHistory(key)
    return _HISTORIES[key]


async def _wanted(client: Client, route_id: str) -> tuple[int, ...]:
    """What each batch on the route still wants; () when its scheduler never started."""
    handle = client.get_workflow_handle_for(
        RouteSchedulerWorkflow.run, scheduler_workflow_id(route_id)
    )
    try:
        status = await quick_query(handle, RouteSchedulerWorkflow.status, time.time())
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return ()
        raise
    return tuple(b.wanted for b in status.batches)


async def estimate_at_submit(
    *,
    client: Client,
    settings: Settings,
    history: ServedHistory,
    first_line: bytes,
    endpoint: str,
    lines: int,
    now: int,
    expires_at: int,
) -> SubmitEstimate:
    """The estimate for a batch of `lines` lines created at `now`, whose input begins with
    `first_line` (its model is the batch's, as far as the estimate goes). Counts it in
    `gateway_batches_likely_to_miss_total` when it says the window will be missed."""
    empty = SubmitEstimate(made_at=now, lines=lines)
    model_id: str | None = None
    try:
        model_id = await asyncio.to_thread(first_model, first_line, endpoint)
        model = settings.model(model_id) if model_id is not None else None
        if model is None:
            return empty
        served = await asyncio.to_thread(history.served, now)
        counts = split_lines(lines, [r.weight for r in model.routes])
        routes = [(r, n) for r, n in zip(model.routes, counts, strict=True) if n > 0]
        if any(r.id not in served for r, _ in routes):
            return empty.model_copy(update={"model": model.id})  # no history: nothing to ask
        wanted = await asyncio.gather(*(_wanted(client, r.id) for r, _ in routes))
    except Exception as err:  # no estimate is an answer; a failed create is not
        log.info("no estimate at submit: %s", err)
        return empty.model_copy(update={"model": model_id})
    est = decide(
        [
            RouteWork(r.id, n, w, served.get(r.id, {}))
            for (r, n), w in zip(routes, wanted, strict=True)
        ],
        now=now,
        expires_at=expires_at,
    )
    if est.window_achievable is False:
        LIKELY_TO_MISS.labels(model=model.id).inc()
    return SubmitEstimate(
        made_at=now,
        expected_finish_at=est.expected_finish_at,
        window_achievable=est.window_achievable,
        lines=lines,
        lines_ahead=est.lines_ahead,
        model=model.id,
    )
