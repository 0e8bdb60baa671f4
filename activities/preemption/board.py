"""Preemptive yield on a worker: which of its running batch lines give their seat back, now.

The api processes send each route's live count straight to every worker (`report`, through the
worker's HTTP server: docs/decisions/0023); this board holds those counts, each route's policy as
its scheduler holds it (`set_policy`: a report carries counts, never policy) and the lines this
worker runs per route. An api process that stops reporting is forgotten, and a route holds at
most `MAX_PROCESSES` of them: whoever reaches the channel cannot grow the board.

When live requests and batch lines together need more seats than the route shares
(`backfill.routes.gates.preempt`), the youngest preemptible lines are told to stop (their
`Ticket.preempted` event): the line activity closes the upstream request and returns
`preempted`. A line about to go upstream waits at the door (`door`) while no seat is free beside
live traffic, so a preempted line that the workflow starts again at once does not take the seat
back before the route scheduler's allotment follows. It waits at most `DOOR_LIMIT` seconds, well
inside its activity's clock: then the line goes back to its batch's queue, `held`, with nothing
counted (waiting is not a try; a line must never time out, or count as lost, at the door).

With a live-latency target in the policy, the board also holds seats back from batch lines
(`held_back`, at most once per `ADJUST_EVERY` seconds, from the highest TTFT the fresh reports
carry): the door and the preemption count with `batch_seats − held_back`. Every change is
handed to `on_held_back` (the worker tells the route's scheduler, whose allotment leaves those
seats out: `worker.held_back`).

With several workers, each tells the others which lines it has upstream (`own_lines`, sent by
`worker.preemption.peers`; `peer_lines` on arrival), so every worker counts the route's whole
picture and ends its own lines among the youngest route-wide (docs/decisions/0035). Lines are ranked
by when they went upstream as the worker running each one tells it (unix seconds by its clock, ties
by worker), so every worker ranks them alike, however long a report took to arrive. Everything
runs on the worker's event loop; `report` and `peer_lines` are called there (the HTTP thread
hands them over).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from backfill.platform.metrics import (
    BATCH_SEATS_HELD_BACK,
    PREEMPT_ON,
    PREEMPT_PEER_REPORTS_DROPPED,
    REPORTING_PROCESSES,
)
from backfill.routes.gates.preempt import (
    PreemptPolicy,
    excess,
    held_back,
    lines_to_preempt,
    may_send,
)

REPORT_TTL = 5.0
"""Seconds an api process's report counts without being renewed (they renew every second while
preemption is on): an api that died stops holding seats, a route switched off stops preempting."""
DOOR_RECHECK = 1.0
"""Seconds a line at the door waits before looking again without a report (reports expire)."""
DOOR_LIMIT = 30.0
"""Seconds a line waits at the door at most before it goes back to its batch's queue (`held`).
Its activity's clock is the line timeout + 60 s (`workflows.line_activity`): the door and the
request both fit in it."""
ADJUST_EVERY = 1.0
"""Seconds between two changes of the seats held back for the live-latency target."""
MAX_PROCESSES = 256
"""Api processes a route's counts are kept for at once; a report from one more is dropped."""
MAX_PEERS = 64
"""Other workers a route's lines are kept for at once; a report from one more is dropped
(`BACKFILL_PREEMPT_MAX_PEERS`)."""
MAX_PEER_LINES = 8192
"""Other workers' lines a route keeps at once, all together; a report that would take it beyond
is dropped (`BACKFILL_PREEMPT_MAX_PEER_LINES`): each preemption ranks them all."""
RATE_WEIGHT = 0.2
"""Weight of the newest completed line in a route's tokens-per-second estimate."""


@dataclass(eq=False)
class Ticket:
    """One line on the board, from its activity's start to its end."""

    route: str
    preemptions: int
    """Times the line was preempted before."""
    sent_at: float | None = None
    """When it went upstream (None: still at the door)."""
    sent_wall: float = 0.0
    """When it went upstream in unix seconds: its rank among the route's lines on every worker."""
    preempted: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class _Report:
    live: int
    at: float
    ttft_ms: float | None = None


class OwnLine(NamedTuple):
    """One of this worker's lines upstream, as the other workers are told of it."""

    age: float
    """Seconds since it went upstream."""
    preemptible: bool
    started_at: float
    """When it went upstream, in unix seconds by this worker's clock."""


@dataclass
class _PeerLines:
    """The batch lines another worker has upstream on a route, as it last reported them."""

    started: list[float]
    """When each went upstream, in unix seconds by the clock of the worker that runs it."""
    preemptible: list[bool]
    at: float


@dataclass
class _Route:
    policy: PreemptPolicy | None = None
    """The route's policy as its scheduler last answered (None: preemption off)."""
    reports: dict[str, _Report] = field(default_factory=dict)
    peers: dict[str, _PeerLines] = field(default_factory=dict)
    """Other workers' lines upstream on the route, by worker (decision 0035)."""
    tickets: list[Ticket] = field(default_factory=list)
    tokens_per_second: float | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    held_back: int = 0
    """Seats held back for the live-latency target, beyond `keep_free`."""
    adjusted_at: float = -1e9


class PreemptBoard:
    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        on_held_back: Callable[[str, int], None] | None = None,
        door_limit: float = DOOR_LIMIT,
        on_lines: Callable[[str], None] | None = None,
        wall: Callable[[], float] = time.time,
        worker: str = "",
        max_peers: int = MAX_PEERS,
        max_peer_lines: int = MAX_PEER_LINES,
    ) -> None:
        self.max_peers = max_peers
        """Other workers whose lines a route keeps (`MAX_PEERS`)."""
        self.max_peer_lines = max_peer_lines
        """Other workers' lines a route keeps, all together (`MAX_PEER_LINES`)."""
        self.on_lines = on_lines
        """Called with the route whenever this worker's lines upstream on it change."""
        self._clock = clock
        self._wall = wall
        """Unix seconds: when lines went upstream, as every worker ranks them."""
        self.worker = worker
        """This worker's id, as the other workers know it (ties between lines)."""
        self.door_limit = door_limit
        """Seconds a line waits at the door at most (`DOOR_LIMIT`)."""
        self._routes: dict[str, _Route] = {}
        self._on_held_back = on_held_back
        """Called with (route, seats) whenever the seats held back from a route change."""

    def _route(self, route: str) -> _Route:
        return self._routes.setdefault(route, _Route())

    # ---- what the route's scheduler and the api processes say ----
    def set_policy(self, route: str, policy: PreemptPolicy | None) -> int:
        """The route's policy as its scheduler holds it now (`worker.preemption.channel`
        `PolicyReader`); returns how many lines were told to stop."""
        r = self._route(route)
        PREEMPT_ON.labels(route).set(policy is not None)
        if policy == r.policy:
            return 0
        r.policy = policy
        self._adjust(route, r)
        self._wake(r)
        return self._preempt(route)

    def report(self, route: str, process: str, live: int, ttft_ms: float | None = None) -> int:
        """An api process's live count on `route` and its recent live TTFT; returns how many
        lines were told to stop. Processes that stopped reporting are forgotten here; a new one
        beyond `MAX_PROCESSES` is not kept."""
        r = self._route(route)
        now = self._clock()
        r.reports = {p: rep for p, rep in r.reports.items() if now - rep.at < REPORT_TTL}
        if process not in r.reports and len(r.reports) >= MAX_PROCESSES:
            return 0
        r.reports[process] = _Report(max(0, live), now, ttft_ms)
        REPORTING_PROCESSES.labels(route).set(len(r.reports))
        self._adjust(route, r)
        self._wake(r)
        return self._preempt(route)

    def peer_lines(
        self,
        route: str,
        worker: str,
        lines: Sequence[tuple[float, bool]],
        started_at: Sequence[float] | None = None,
    ) -> int:
        """Another worker's lines upstream on `route` (each: seconds since it went upstream,
        whether it may still be preempted; `started_at`: when each went upstream, in unix
        seconds by that worker's clock, else placed by its age on arrival, as a worker of 0.2.0
        reports); returns how many of this worker's lines were told to stop. Workers that
        stopped reporting are forgotten; a report from one beyond `max_peers`, or that would
        take the route's other workers' lines beyond `max_peer_lines`, is not kept (the
        worker's earlier report is kept until it expires)."""
        r = self._route(route)
        now = self._clock()
        r.peers = {w: p for w, p in r.peers.items() if now - p.at < REPORT_TTL}
        if worker not in r.peers and len(r.peers) >= self.max_peers:
            PREEMPT_PEER_REPORTS_DROPPED.labels(route, "peers").inc()
            return 0
        others = sum(len(p.started) for w, p in r.peers.items() if w != worker)
        if others + len(lines) > self.max_peer_lines:
            PREEMPT_PEER_REPORTS_DROPPED.labels(route, "lines").inc()
            return 0
        if started_at is None:
            wall = self._wall()
            started_at = [wall - age for age, _ in lines]
        r.peers[worker] = _PeerLines(list(started_at), [p for _, p in lines], now)
        self._wake(r)
        return self._preempt(route)

    def own_lines(self, route: str) -> list[OwnLine]:
        """This worker's lines upstream on `route` and not told to stop, for the other
        workers."""
        r = self._route(route)
        now = self._clock()
        bound = r.policy.max_preemptions if r.policy is not None else None
        return [
            OwnLine(max(0.0, now - t.sent_at), bound is None or t.preemptions < bound, t.sent_wall)
            for t in r.tickets
            if t.sent_at is not None and not t.preempted.is_set()
        ]

    def _peers_fresh(self, r: _Route) -> tuple[list[float], list[bool], list[str]]:
        """The other workers' lines still renewed: when each went upstream (unix seconds),
        whether it may be preempted, and the worker that runs it."""
        now = self._clock()
        started: list[float] = []
        preemptible: list[bool] = []
        owners: list[str] = []
        for worker, p in r.peers.items():
            if now - p.at < REPORT_TTL:
                started += p.started
                preemptible += p.preemptible
                owners += [worker] * len(p.started)
        return started, preemptible, owners

    def _lines_changed(self, route: str) -> None:
        if self.on_lines is not None:
            self.on_lines(route)

    @staticmethod
    def _wake(r: _Route) -> None:
        r.changed.set()
        r.changed = asyncio.Event()  # waiters hold the old one, now set

    def _fresh(self, r: _Route) -> list[_Report]:
        now = self._clock()
        return [p for p in r.reports.values() if now - p.at < REPORT_TTL]

    def _current(self, r: _Route) -> tuple[int, PreemptPolicy | None]:
        """(live in flight summed over every api process still reporting, the route's policy
        with the seats held back for the live-latency target taken off its `batch_seats`; None
        while no api process reports: a silent channel preempts nothing)."""
        fresh = self._fresh(r)
        if not fresh or r.policy is None:
            return 0, None
        policy = r.policy
        if r.held_back:
            policy = policy.model_copy(update={"batch_seats": policy.batch_seats - r.held_back})
        return sum(p.live for p in fresh), policy

    def policy(self, route: str) -> PreemptPolicy | None:
        return self._current(self._route(route))[1]

    def resumes(self, route: str) -> bool:
        """Whether the route's preemption is on with `resume` (its scheduler's policy), reports
        or not: a line sent now may be preempted before it ends, and would continue."""
        policy = self._route(route).policy
        return policy is not None and policy.resume

    def held_back(self, route: str) -> int:
        """Seats held back from `route`'s batch lines for its live-latency target now."""
        return self._route(route).held_back

    def _adjust(self, route: str, r: _Route) -> None:
        """Follow the live-latency target: at most once per `ADJUST_EVERY`, from the highest
        TTFT the fresh reports carry."""
        now = self._clock()
        fresh = self._fresh(r)
        policy = r.policy if fresh else None
        target = policy.ttft_target_ms if policy is not None else None
        before = r.held_back
        if target is None or policy is None:
            r.held_back = 0
        elif now - r.adjusted_at >= ADJUST_EVERY:
            measured = [p.ttft_ms for p in fresh if p.ttft_ms is not None]
            observed = max(measured) if measured else None
            r.held_back = held_back(r.held_back, observed, target, policy.batch_seats)
            r.adjusted_at = now
        BATCH_SEATS_HELD_BACK.labels(route).set(r.held_back)
        if r.held_back != before and self._on_held_back is not None:
            self._on_held_back(route, r.held_back)

    def _preempt(self, route: str) -> int:
        r = self._route(route)
        live, policy = self._current(r)
        if policy is None:
            return 0
        sending = [t for t in r.tickets if t.sent_at is not None and not t.preempted.is_set()]
        peer_started, peer_preemptible, peer_owners = self._peers_fresh(r)
        n = excess(policy, live, len(sending) + len(peer_started))
        if n == 0:
            return 0
        # The youngest lines route-wide, ranked alike on every worker (each line by the time its
        # own worker tells); each worker ends its own among them (decision 0035).
        chosen = lines_to_preempt(
            [t.sent_wall for t in sending] + peer_started,
            [t.preemptions < policy.max_preemptions for t in sending] + peer_preemptible,
            n,
            [self.worker] * len(sending) + peer_owners,
        )
        mine = [i for i in chosen if i < len(sending)]
        for i in mine:
            sending[i].preempted.set()
        if mine:
            self._lines_changed(route)
        return len(mine)

    # ---- what the line activities do ----
    def enter(self, route: str, preemptions: int) -> Ticket:
        ticket = Ticket(route, preemptions)
        self._route(route).tickets.append(ticket)
        return ticket

    async def door(self, ticket: Ticket) -> bool:
        """True when the line may go upstream (then it is counted as sending): at once unless
        preemption is on for its route and no seat is free beside live traffic. False when no
        seat came free within `door_limit` seconds: the line is not sent."""
        r = self._route(ticket.route)
        give_up = self._clock() + self.door_limit
        while True:
            live, policy = self._current(r)
            sending = sum(1 for t in r.tickets if t.sent_at is not None)
            sending += len(self._peers_fresh(r)[0])
            if policy is None or may_send(policy, live, sending):
                break
            left = give_up - self._clock()
            if left <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(DOOR_RECHECK, left)):
                    await r.changed.wait()
        ticket.sent_at = self._clock()
        ticket.sent_wall = self._wall()
        self._lines_changed(ticket.route)
        return True

    def leave(self, ticket: Ticket) -> None:
        r = self._route(ticket.route)
        with contextlib.suppress(ValueError):
            r.tickets.remove(ticket)
        self._wake(r)
        if ticket.sent_at is not None:
            self._lines_changed(ticket.route)

    def finished(self, ticket: Ticket, tokens: int) -> None:
        """The line's answer came, with `tokens` generated since it went upstream (the route's
        tokens per second per line, for `wasted_tokens`)."""
        if tokens <= 0 or ticket.sent_at is None:
            return
        seconds = self._clock() - ticket.sent_at
        if seconds <= 0:
            return
        r = self._route(ticket.route)
        rate = tokens / seconds
        old = r.tokens_per_second
        r.tokens_per_second = rate if old is None else old + RATE_WEIGHT * (rate - old)

    def wasted_tokens(self, ticket: Ticket) -> int:
        """Tokens a preempted line had likely generated: its time upstream × the route's
        tokens per second per line (learned from completed lines; 0 before the first)."""
        rate = self._route(ticket.route).tokens_per_second
        if rate is None or ticket.sent_at is None:
            return 0
        return int(rate * max(0.0, self._clock() - ticket.sent_at))
