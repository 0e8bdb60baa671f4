"""The usage journal: one entry per upstream attempt (batch line attempt or live request).

Storage (docs/decisions/0012-usage-journal.md): append-only files of JSON lines under
`<data_dir>/usage/`, one file per process per hour (`<YYYYMMDDHH>.<process>.jsonl`), so several
api and worker processes never write the same file and a reader aggregates them all. Entries are
buffered and written + fsynced in small batches by a background thread (at most
`flush_seconds` later, or at once when `flush_lines` are waiting, and on close): a crash loses
at most that last moment's entries, never a file. The process that records an entry also counts
it in its Prometheus counters (`gateway_usage_*`).

Reading is pure over the files: `read_entries` streams the hours in a range, `hourly_totals`
sums them per hour x workspace x model x service class.

Retention: with `retention_days` set, the writer thread deletes the files of hours that ended
more than that long ago (`prune_journal`, every process's files in the directory), when it
starts and then once an hour. Every hour within the bound is kept whole.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from prometheus_client import Counter
from pydantic import ConfigDict
from pydantic.dataclasses import dataclass as pydantic_dataclass

log = logging.getLogger(__name__)

ServiceClass = Literal["batch", "live"]
USAGE_DIR = "usage"
"""The journal's directory under the file store's root."""
HOUR = 3600

USAGE_TOKENS = Counter(
    "gateway_usage_tokens_total",
    "Tokens of upstream attempts served by this process, by kind (prompt, completion).",
    ["workspace", "model", "service_class", "kind"],
)
USAGE_REQUESTS = Counter(
    "gateway_usage_requests_total",
    "Upstream attempts (batch line attempts, live requests) made by this process.",
    ["workspace", "model", "service_class"],
)


@dataclass(frozen=True)
class UsageEntry:
    """One upstream attempt, as journaled."""

    at: float
    """Unix seconds when the attempt ended."""
    request_id: str
    """The `X-Request-ID` sent upstream."""
    workspace: str
    key_id: str | None
    """The id of the key the work runs under (a batch: its identity snapshot); never the key."""
    model: str
    route: str
    service_class: ServiceClass
    status: str
    """The HTTP status as text (`200`, `429`, ...), or the error code when none came back."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    batch_id: str | None = None

    @property
    def hour(self) -> int:
        """Start of the entry's hour, Unix seconds."""
        return int(self.at) // HOUR * HOUR

    def to_line(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode() + b"\n"

    @classmethod
    def from_line(cls, line: bytes) -> UsageEntry:
        """An entry from its line; fields a newer writer added are ignored, not fatal."""
        data = json.loads(line)
        return cls(**{k: v for k, v in data.items() if k in _FIELDS})


_FIELDS = frozenset(f.name for f in fields(UsageEntry))


@dataclass(frozen=True)
class UsageAccount:
    """Whom an upstream attempt is accounted to, known before it is sent; `entry` is the one
    place an attempt's `UsageEntry` is built (a batch line's in the worker, a live request's in
    the api)."""

    workspace: str
    key_id: str | None
    model: str
    route: str
    service_class: ServiceClass
    batch_id: str | None = None

    def entry(
        self, request_id: str, status: str, prompt_tokens: int = 0, completion_tokens: int = 0
    ) -> UsageEntry:
        """The attempt that just ended (now), with its status and token counts."""
        return UsageEntry(
            at=time.time(),
            request_id=request_id,
            status=status,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            **asdict(self),
        )


@pydantic_dataclass(frozen=True, config=ConfigDict(use_attribute_docstrings=True))
class UsageTotal:
    """One hour's usage of one workspace x model x service class: the journal's sums, and what
    the usage API (`GET /api/v1/admin/usage`) and the console's usage page show."""

    hour: int
    """Start of the hour, Unix seconds (UTC)."""
    workspace: str
    model: str
    service_class: ServiceClass
    """`batch` (batch line attempts) or `live` (live requests)."""
    requests: int
    """Upstream attempts (a line retried after a 429 counts each attempt)."""
    prompt_tokens: int
    completion_tokens: int


def hour_name(hour: int) -> str:
    return datetime.fromtimestamp(hour, UTC).strftime("%Y%m%d%H")


def _hour_of(name: str) -> int | None:
    try:
        return int(datetime.strptime(name, "%Y%m%d%H").replace(tzinfo=UTC).timestamp())
    except ValueError:
        return None


def process_name() -> str:
    """A name no other process (here or on another host) writes under."""
    host = "".join(c if c.isalnum() or c in "-_" else "_" for c in socket.gethostname())
    return f"{host}-{os.getpid()}-{secrets.token_hex(3)}"


class UsageJournal:
    """This process's journal writer: `record` is cheap (a buffer append and two counters)."""

    def __init__(
        self,
        root: Path,
        *,
        process: str | None = None,
        flush_seconds: float = 0.5,
        flush_lines: int = 256,
        retention_days: int | None = None,
    ) -> None:
        """`retention_days`: prune hours older than that (`prune_journal`); None keeps all."""
        self.dir = Path(root) / USAGE_DIR
        self.dir.mkdir(mode=0o750, parents=True, exist_ok=True)
        self.process = process or process_name()
        self.flush_seconds = flush_seconds
        self.flush_lines = flush_lines
        self._pending: list[UsageEntry] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self.retention_days = retention_days
        self._pruned_hour: int | None = None
        self._thread = threading.Thread(target=self._run, name="usage-journal", daemon=True)
        self._thread.start()

    def record(self, entry: UsageEntry) -> None:
        labels = (entry.workspace, entry.model, entry.service_class)
        USAGE_REQUESTS.labels(*labels).inc()
        if entry.prompt_tokens:
            USAGE_TOKENS.labels(*labels, "prompt").inc(entry.prompt_tokens)
        if entry.completion_tokens:
            USAGE_TOKENS.labels(*labels, "completion").inc(entry.completion_tokens)
        with self._lock:
            self._pending.append(entry)
            if len(self._pending) >= self.flush_lines:
                self._wake.set()

    def flush(self) -> None:
        """Write and fsync everything recorded so far."""
        with self._lock:
            entries, self._pending = self._pending, []
        by_hour: dict[int, list[bytes]] = {}
        for e in entries:
            by_hour.setdefault(e.hour, []).append(e.to_line())
        for hour, lines in by_hour.items():
            path = self.dir / f"{hour_name(hour)}.{self.process}.jsonl"
            fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                size = os.fstat(fd).st_size
                if size and os.pread(fd, 1, size - 1) != b"\n":  # torn by a crash: end it
                    lines.insert(0, b"\n")
                os.write(fd, b"".join(lines))
                os.fsync(fd)
            finally:
                os.close(fd)

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        self._thread.join(timeout=10)
        self.flush()

    def _run(self) -> None:
        self._prune()
        while not self._closed:
            self._wake.wait(self.flush_seconds)
            self._wake.clear()
            try:
                self.flush()
            except OSError:  # the disk is full or gone: keep serving, say so
                log.exception("usage journal: could not write")
            self._prune()

    def _prune(self) -> None:
        """`prune_journal` once an hour (a new hour is the only time an old one passes out of
        the bound)."""
        now = time.time()
        if self.retention_days is None or self._pruned_hour == int(now) // HOUR:
            return
        self._pruned_hour = int(now) // HOUR
        try:
            pruned = prune_journal(self.dir.parent, now - self.retention_days * 86400)
        except OSError:
            log.exception("usage journal: could not prune")
            return
        if pruned:
            log.info(
                "usage journal: deleted %d files older than %d days", pruned, self.retention_days
            )


def prune_journal(root: Path, before: float) -> int:
    """Delete the journal files (every process's) of hours that ended at or before `before`;
    how many. Several processes sharing the directory may prune at once."""
    usage_dir = Path(root) / USAGE_DIR
    if not usage_dir.is_dir():
        return 0
    pruned = 0
    for path in usage_dir.glob("*.jsonl"):
        hour = _hour_of(path.name.split(".", 1)[0])
        if hour is None or hour + HOUR > before:
            continue
        try:
            path.unlink()
        except FileNotFoundError:  # another process pruned it
            continue
        pruned += 1
    return pruned


def read_entries(
    root: Path, start: float | None = None, end: float | None = None
) -> Iterator[UsageEntry]:
    """Every journaled entry with `start` <= at < `end`, from every process's files.

    Files of hours wholly outside the range are not opened. A torn last line (a process died
    mid-write) is skipped."""
    usage_dir = Path(root) / USAGE_DIR
    if not usage_dir.is_dir():
        return
    for path in sorted(usage_dir.glob("*.jsonl")):
        hour = _hour_of(path.name.split(".", 1)[0])
        if hour is None:
            continue
        if (start is not None and hour + HOUR <= start) or (end is not None and hour >= end):
            continue
        with path.open("rb") as f:
            for line in f:
                try:
                    entry = UsageEntry.from_line(line)
                except (ValueError, TypeError):
                    continue
                if (start is None or entry.at >= start) and (end is None or entry.at < end):
                    yield entry


def hourly_totals(entries: Iterable[UsageEntry], workspace: str | None = None) -> list[UsageTotal]:
    """Totals per hour x workspace x model x service class, in that order."""
    sums: dict[tuple[int, str, str, ServiceClass], list[int]] = {}
    for e in entries:
        if workspace is not None and e.workspace != workspace:
            continue
        s = sums.setdefault((e.hour, e.workspace, e.model, e.service_class), [0, 0, 0])
        s[0] += 1
        s[1] += e.prompt_tokens
        s[2] += e.completion_tokens
    return [
        UsageTotal(h, w, m, c, requests=n, prompt_tokens=p, completion_tokens=t)
        for (h, w, m, c), (n, p, t) in sorted(sums.items())
    ]


def new_request_id() -> str:
    """A fresh `X-Request-ID` for one upstream attempt."""
    return f"req_{secrets.token_hex(12)}"
