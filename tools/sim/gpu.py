"""The simulator's GPU mode: a continuous-batching engine shaped like vLLM's.

One engine loop runs steps while anything is running or waiting. Before each step it admits
waiting sequences (FCFS, or lower ``priority`` first, then arrival, like vLLM's priority policy)
while fewer than ``max_num_seqs`` run, the KV-cache budget has room and the step's token budget
is not spent. A step costs ``step_base_ms + step_per_seq_ms × running + prefill_per_token_ms ×
prompt tokens admitted in it``; when it ends, every running sequence has one more token (a new
one has its first token: prefill and the first decode share the step, as with vLLM's chunked
prefill). Tokens are words of the reply, prompts are counted in words.

Prefix cache (``prefix_caching``, on by default as in vLLM; ``tools.sim.prefix_cache``): a
prompt whose leading blocks some earlier request computed (its prompt, or its prompt and what it
generated, kept after it ended) prefills only the rest, so a preempted request continued with its
partial answer (decision 0036) costs little prefill.

KV cache: a running sequence holds ``prompt + generated`` tokens, which is what the
``vllm:kv_cache_usage_perc`` gauge reports (held ÷ ``kv_cache_tokens``). Admission reserves a
sequence's worst case (``prompt + max_new``) so that a running sequence never has to be preempted:
a request waits while its worst case does not fit beside the running ones' worst cases. vLLM
allocates lazily and preempts instead; the gauge therefore reads lower than the reservation here
when the budget is what blocks admission.

This module knows nothing of HTTP: ``tools.sim.server`` turns a request into a
``GpuSequence``, ``submit``s it and writes each token to the client as the engine hands it
over. Latencies are recorded per class (live requests, and batch lines that carry
``X-Backfill-Batch``).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, Field

from tools.sim.prefix_cache import PrefixCache

TrafficClass = Literal["live", "batch"]
FINISHED = None
"""What a sequence's queue yields after its last token (or when it is aborted)."""
KEEP_ABORTED = 4096
"""Aborted sequences remembered per prompt, for continuations to be matched with."""


class GpuConfig(BaseModel):
    """The capacity model of GPU mode (``backfill sim --gpu``)."""

    step_base_ms: float = Field(default=20.0, ge=0)
    """Fixed cost of one engine step (weights read once per step)."""
    step_per_seq_ms: float = Field(default=1.0, ge=0)
    """Added per running sequence: a bigger batch makes every step slower."""
    prefill_per_token_ms: float = Field(default=0.02, ge=0)
    """Added per prompt token prefilled in the step."""
    kv_cache_tokens: int = Field(default=65536, ge=1)
    """KV-cache budget in tokens (prompt + generated of every running sequence)."""
    max_num_batched_tokens: int = Field(default=8192, ge=1)
    """Tokens one step may process (one per decoding sequence plus admitted prompts); a prompt
    longer than the whole budget is still admitted alone."""
    prefix_caching: bool = True
    """vLLM's automatic prefix caching (on by default since vLLM V1): a cached prompt prefix is
    not prefilled again."""
    block_size: int = Field(default=16, ge=1)
    """Tokens per KV-cache block, the prefix cache's unit (vLLM's default 16)."""
    default_output_tokens: int = Field(default=16, ge=1)
    """Reply length of a request without ``max_tokens`` (finish reason ``stop``); with it, the
    reply is exactly ``max_tokens`` long (finish reason ``length``)."""


@dataclass(eq=False)
class GpuSequence:
    """One request inside the engine. ``tokens`` gets 1 per generated token, then ``FINISHED``."""

    prompt_tokens: int
    max_new: int
    """Tokens to generate (0 for embeddings: done after its prefill step)."""
    priority: int = 0
    traffic: TrafficClass = "live"
    has_priority: bool = False
    """Whether the request body carried a ``priority`` field at all."""
    arrival: float = field(default_factory=time.monotonic)
    generated: int = 0
    admitted_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    aborted: bool = False
    aborted_at: float | None = None
    """When its client left (monotonic), if it did before its last token."""
    tokens: asyncio.Queue[int | None] = field(default_factory=asyncio.Queue)
    counted_in: ClassCounters | None = field(default=None, repr=False)
    """The counters its latest tokens were counted in (a log's reset makes new ones)."""
    counted: int = 0
    """Its tokens counted in ``counted_in``."""
    text: list[str] = field(default_factory=list, repr=False)
    """The prompt's tokens followed by the reply's (``max_new`` of them), the prefix cache's
    names for its blocks; empty: never cached."""
    cached_tokens: int = 0
    """Of the prompt, tokens found in the prefix cache at admission (not prefilled)."""
    key: str | None = None
    """What it answers (the prompt a continuation continues the reply to): a continuation
    is matched with the aborted request whose tokens it keeps (``ClassCounters.kept_tokens``)."""
    continues: int = 0
    """Tokens of an earlier, aborted reply it continues (sent back in its prompt)."""

    @property
    def held_tokens(self) -> int:
        return self.prompt_tokens + self.generated

    @property
    def reserved_tokens(self) -> int:
        return self.prompt_tokens + self.max_new


@dataclass(frozen=True, slots=True)
class LatencyRecord:
    """One finished request, as the benchmark reads it (seconds, monotonic clock)."""

    traffic: TrafficClass
    arrival: float
    ttft_s: float
    """Arrival until the first token (for embeddings: until the result)."""
    e2e_s: float
    queued_s: float
    """Arrival until admission to the running batch."""
    prompt_tokens: int
    completion_tokens: int
    priority: int
    has_priority: bool


def percentile(values: Iterable[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0–100) of ``values``; None when empty."""
    data = sorted(values)
    if not data:
        return None
    rank = max(1, math.ceil(q / 100.0 * len(data)))
    return data[min(rank, len(data)) - 1]


@dataclass
class ClassCounters:
    """Running totals of one traffic class (never shrunk by finished requests)."""

    generated_tokens: int = 0
    """Tokens generated for this class, counted at each step (aborted requests' too)."""
    finished: int = 0
    aborted: int = 0
    aborted_tokens: int = 0
    """Of ``generated_tokens``, those of requests aborted since: work thrown away when their
    client left (tokens an aborted request had before the last reset are not counted)."""
    kept_tokens: int = 0
    """Of ``aborted_tokens``, those a later request sent back as the partial answer it
    continues (decision 0036): generated once, kept, not thrown away."""
    aborted_tokens_at: list[tuple[float, int]] = field(default_factory=list)
    """(when, tokens) of each aborted request whose tokens were counted here."""
    kept_at: list[tuple[float, int]] = field(default_factory=list)
    """(when the request it continues was aborted, tokens kept) of each continuation: a bench
    credits a window's aborts with the continuations that come after it."""
    aborted_at: list[float] = field(default_factory=list)
    """When each aborted request's client left (monotonic: comparable across processes of one
    host), so a benchmark can time how fast a seat is taken back."""


@dataclass
class LatencyLog:
    """Per-class latency records and token counters; ``reset`` starts a new measurement."""

    records: list[LatencyRecord] = field(default_factory=list)
    live: ClassCounters = field(default_factory=ClassCounters)
    batch: ClassCounters = field(default_factory=ClassCounters)
    since: float = field(default_factory=time.monotonic)

    def counters(self, traffic: TrafficClass) -> ClassCounters:
        return self.live if traffic == "live" else self.batch

    def reset(self) -> None:
        self.records.clear()
        self.live, self.batch, self.since = ClassCounters(), ClassCounters(), time.monotonic()

    def summary(self) -> dict[str, Any]:
        """p50/p99/mean TTFT and e2e in ms per class, tokens and counts (``GET /sim/latencies``)."""
        out: dict[str, Any] = {"seconds": time.monotonic() - self.since}
        for traffic in ("live", "batch"):
            recs = [r for r in self.records if r.traffic == traffic]
            c = self.counters(traffic)  # type: ignore[arg-type]
            out[traffic] = {
                "finished": c.finished,
                "aborted": c.aborted,
                "aborted_at": list(c.aborted_at),
                "aborted_tokens": c.aborted_tokens,
                "kept_tokens": c.kept_tokens,
                "generated_tokens": c.generated_tokens,
                "completion_tokens": sum(r.completion_tokens for r in recs),
                "prompt_tokens": sum(r.prompt_tokens for r in recs),
                "with_priority": sum(r.has_priority for r in recs),
                "ttft_ms": _dist(r.ttft_s for r in recs),
                "e2e_ms": _dist(r.e2e_s for r in recs),
                "queued_ms": _dist(r.queued_s for r in recs),
            }
        return out


def _dist(seconds: Iterable[float]) -> dict[str, float | None]:
    ms = [s * 1000.0 for s in seconds]
    return {
        "p50": percentile(ms, 50),
        "p99": percentile(ms, 99),
        "mean": sum(ms) / len(ms) if ms else None,
        "max": max(ms) if ms else None,
    }


class SequenceTooLong(ValueError):
    """The request could never fit the KV-cache budget (vLLM answers 400)."""


class GpuEngine:
    """Continuous batching over ``max_num_seqs`` seats and a KV-cache budget.

    ``running``/``waiting``/``peak_*`` mirror ``tools.sim.server.Scheduler`` so the server's
    stats and gauges read either one.
    """

    def __init__(self, config: GpuConfig, max_num_seqs: int, use_priority: bool) -> None:
        self.config, self.max_num_seqs, self.use_priority = config, max_num_seqs, use_priority
        self.log = LatencyLog()
        self.peak_running = self.peak_waiting = 0
        self.steps = 0
        self.busy_s = 0.0
        """Engine time spent in steps (for utilisation)."""
        self._running: list[GpuSequence] = []
        self._heap: list[tuple[int, int, GpuSequence]] = []
        self._waiting = 0
        self._arrivals = itertools.count()
        self._task: asyncio.Task[None] | None = None
        self.prefix_cache = (
            PrefixCache(config.block_size, config.kv_cache_tokens // config.block_size)
            if config.prefix_caching
            else None
        )
        self._aborted: dict[str, list[GpuSequence]] = {}
        """Aborted sequences by ``key``, the latest ``KEEP_ABORTED`` (a continuation's match)."""

    # -- state ---------------------------------------------------------------------------------

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def waiting(self) -> int:
        return self._waiting

    @property
    def held_tokens(self) -> int:
        return sum(s.held_tokens for s in self._running)

    @property
    def kv_cache_usage(self) -> float:
        return min(1.0, self.held_tokens / self.config.kv_cache_tokens)

    def step_ms(self, running: int, prefill_tokens: int = 0) -> float:
        """Duration of one step with ``running`` sequences and that many prompt tokens."""
        c = self.config
        return (
            c.step_base_ms + c.step_per_seq_ms * running + c.prefill_per_token_ms * prefill_tokens
        )

    # -- requests ------------------------------------------------------------------------------

    def submit(self, seq: GpuSequence) -> None:
        """Queue ``seq``; its tokens arrive on ``seq.tokens``. Raises ``SequenceTooLong``."""
        if seq.reserved_tokens > self.config.kv_cache_tokens:
            raise SequenceTooLong(
                f"This request needs {seq.reserved_tokens} tokens (prompt {seq.prompt_tokens} + "
                f"completion {seq.max_new}), more than the KV cache holds "
                f"({self.config.kv_cache_tokens})."
            )
        if seq.continues > 0 and seq.key is not None:
            self._keep_continued(seq)
        key = seq.priority if self.use_priority else 0
        heapq.heappush(self._heap, (key, next(self._arrivals), seq))
        self._waiting += 1
        self.peak_waiting = max(self.peak_waiting, self._waiting)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._loop())

    def abort(self, seq: GpuSequence) -> None:
        """The client left: free its seat and cache at once (like vLLM aborting a request); a
        waiting sequence takes the seat at the next step's admission."""
        if seq.aborted or seq.finished_at is not None:
            return
        seq.aborted = True
        seq.aborted_at = time.monotonic()
        counters = self.log.counters(seq.traffic)
        counters.aborted += 1
        if seq.counted_in is counters:
            counters.aborted_tokens += seq.counted
            counters.aborted_tokens_at.append((seq.aborted_at, seq.counted))
        counters.aborted_at.append(seq.aborted_at)
        if seq in self._running:
            self._running.remove(seq)
            self._cache_ended(seq)
        else:
            self._waiting -= 1  # its heap entry is skipped lazily
        if seq.key is not None and seq.generated > 0:
            aborted = self._aborted.setdefault(seq.key, [])
            aborted.append(seq)
            del aborted[:-KEEP_ABORTED]
        seq.tokens.put_nowait(FINISHED)

    def _keep_continued(self, seq: GpuSequence) -> None:
        """``seq`` continues an aborted reply: the tokens of it that were counted (in this
        log) and are sent back are kept, not thrown away. Requests with the same prompt are
        told apart only by how far their replies got (an aborted continuation's reply holds
        what it continued too): the one that got the least far, at least as far as the partial
        answer (the client read all but the tokens in flight when it closed), the latest of
        those, is taken. Of its own tokens, those in the partial answer are kept."""
        counters = self.log.counters(seq.traffic)
        candidates = self._aborted.get(seq.key or "", [])

        def beyond(old: GpuSequence) -> int:
            return old.continues + old.generated - seq.continues

        best: int | None = None
        for i, old in enumerate(candidates):
            if beyond(old) >= 0 and (best is None or beyond(old) <= beyond(candidates[best])):
                best = i
        if best is not None:
            old = candidates.pop(best)
            if old.counted_in is counters:
                kept = min(max(0, seq.continues - old.continues), old.counted)
                counters.kept_tokens += kept
                counters.kept_at.append((old.aborted_at or 0.0, kept))

    def _cache_ended(self, seq: GpuSequence) -> None:
        if self.prefix_cache is not None and seq.text:
            self.prefix_cache.keep(seq.text[: seq.prompt_tokens + seq.generated])

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    # -- the engine loop -----------------------------------------------------------------------

    def _admit(self) -> int:
        """Move waiting sequences into the batch; returns the prompt tokens to prefill (those
        the prefix cache does not hold)."""
        c = self.config
        reserved = sum(s.reserved_tokens for s in self._running)
        budget = c.max_num_batched_tokens - len(self._running)
        prefill, now = 0, time.monotonic()
        while self._heap and len(self._running) < self.max_num_seqs:
            seq = self._heap[0][2]
            if seq.aborted:
                heapq.heappop(self._heap)
                continue
            if reserved + seq.reserved_tokens > c.kv_cache_tokens:
                break  # head of line waits for cache (vLLM does not skip it either)
            uncached = seq.prompt_tokens - self._cached(seq)
            if prefill and prefill + uncached > budget:
                break  # next step
            heapq.heappop(self._heap)
            self._waiting -= 1
            seq.admitted_at = now
            self._running.append(seq)
            reserved += seq.reserved_tokens
            if self.prefix_cache is not None and seq.text:
                seq.cached_tokens = self.prefix_cache.cached_prefix(seq.text[: seq.prompt_tokens])
            prefill += seq.prompt_tokens - seq.cached_tokens
        self.peak_running = max(self.peak_running, len(self._running))
        return prefill

    def _cached(self, seq: GpuSequence) -> int:
        """Tokens of ``seq``'s prompt the prefix cache holds now (a look, not a lookup)."""
        if self.prefix_cache is None or not seq.text:
            return 0
        return self.prefix_cache.peek(seq.text[: seq.prompt_tokens])

    async def _loop(self) -> None:
        while True:
            prefill = self._admit()
            if not self._running:
                if self._waiting == 0:
                    return
                await asyncio.sleep(0)  # only aborted entries left in the heap: drop them
                continue
            step_s = self.step_ms(len(self._running), prefill) / 1000.0
            # A late wake-up (a busy event loop) makes that step longer, never the next shorter:
            # every token comes at least one modelled step after the previous one.
            await asyncio.sleep(step_s)
            self.steps += 1
            self.busy_s += step_s
            self._finish_step()

    def _finish_step(self) -> None:
        now = time.monotonic()
        for seq in list(self._running):
            if seq.max_new > 0:
                seq.generated += 1
                counters = self.log.counters(seq.traffic)
                counters.generated_tokens += 1
                if seq.counted_in is not counters:
                    seq.counted_in, seq.counted = counters, 0
                seq.counted += 1
                seq.tokens.put_nowait(1)
            if seq.first_token_at is None:
                seq.first_token_at = now
            if seq.generated >= seq.max_new:
                self._running.remove(seq)
                self._cache_ended(seq)
                self._finish(seq, now)

    def _finish(self, seq: GpuSequence, now: float) -> None:
        seq.finished_at = now
        self.log.counters(seq.traffic).finished += 1
        first = seq.first_token_at if seq.first_token_at is not None else now
        self.log.records.append(
            LatencyRecord(
                traffic=seq.traffic,
                arrival=seq.arrival,
                ttft_s=first - seq.arrival,
                e2e_s=now - seq.arrival,
                queued_s=(seq.admitted_at or now) - seq.arrival,
                prompt_tokens=seq.prompt_tokens,
                completion_tokens=seq.generated,
                priority=seq.priority,
                has_priority=seq.has_priority,
            )
        )
        seq.tokens.put_nowait(FINISHED)
