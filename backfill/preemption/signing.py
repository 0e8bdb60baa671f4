"""Signed reports on preemptive yield's channel: the shared token is a key, never sent.

Every report an api process or a worker sends on the channel (`POST /preempt/live`,
`/preempt/lines`) carries `TIMESTAMP_HEADER` (unix seconds by the sender's clock) and
`SIGNATURE_HEADER` (`v1=` and the hex HMAC-SHA256, keyed with `BACKFILL_PREEMPT_TOKEN`, of the
version, the path, the timestamp and the body). The receiver recomputes it in constant time and
takes a report only when the timestamp is within `WINDOW` seconds of its own clock and later than
the last one it took from the same sender on the same route (`ReplayGuard`): whoever sees a
report on the wire learns no secret, cannot change a byte of it, and cannot send it again
(docs/decisions/0046).
"""

from __future__ import annotations

import hashlib
import hmac
import threading
import time
from dataclasses import dataclass, field

TIMESTAMP_HEADER = "X-Backfill-Preempt-Timestamp"
SIGNATURE_HEADER = "X-Backfill-Preempt-Signature"
VERSION = "v1"
WINDOW = 30.0
"""Seconds a report's timestamp may differ from the receiver's clock (both ways: the machines'
clocks are kept by NTP, milliseconds apart)."""
MIN_TOKEN_LENGTH = 32
"""Shortest `BACKFILL_PREEMPT_TOKEN` accepted at start (`openssl rand -hex 32` makes 64)."""
MAX_SENDERS = 65_536
"""Senders (route, process or worker) the replay guard remembers at once; only signed reports
enter it, and entries older than `WINDOW` are dropped, so this bound is a backstop."""


def _mac(token: str, path: str, timestamp: str, body: bytes) -> str:
    message = f"{VERSION}\n{path}\n{timestamp}\n".encode() + body
    return hmac.new(token.encode(), message, hashlib.sha256).hexdigest()


def sign(token: str, path: str, body: bytes, now: float | None = None) -> dict[str, str]:
    """The headers that authenticate `body` sent to `path` at `now` (unix seconds)."""
    timestamp = f"{time.time() if now is None else now:.6f}"
    return {
        TIMESTAMP_HEADER: timestamp,
        SIGNATURE_HEADER: f"{VERSION}={_mac(token, path, timestamp, body)}",
    }


def verified_at(
    token: str,
    path: str,
    body: bytes,
    timestamp: str | None,
    signature: str | None,
    now: float | None = None,
) -> float | None:
    """The report's timestamp when its signature is the token's and the timestamp is within
    `WINDOW` of `now`; None otherwise (a wrong key, a changed byte, a stale or future report, a
    missing or malformed header)."""
    if timestamp is None or signature is None or len(timestamp) > 32:
        return None
    try:
        at = float(timestamp)
    except ValueError:
        return None
    expected = f"{VERSION}={_mac(token, path, timestamp, body)}"
    if not hmac.compare_digest(signature.encode(), expected.encode()):
        return None
    now = time.time() if now is None else now
    return at if abs(now - at) <= WINDOW else None


@dataclass
class ReplayGuard:
    """The last timestamp taken from each sender: a report no later than it is a replay (a
    sender sends its reports on a route one after the other, so each is later than the last).
    Thread-safe: the worker's HTTP server calls it from its connections' threads."""

    last: dict[tuple[str, ...], float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, sender: tuple[str, ...], at: float, now: float | None = None) -> bool:
        """Whether a verified report from `sender` stamped `at` is new (then remembered)."""
        now = time.time() if now is None else now
        with self._lock:
            if at <= self.last.get(sender, float("-inf")):
                return False
            if sender not in self.last and len(self.last) >= MAX_SENDERS:
                self.last = {s: t for s, t in self.last.items() if now - t <= WINDOW}
                if len(self.last) >= MAX_SENDERS:
                    return False
            self.last[sender] = at
            return True
