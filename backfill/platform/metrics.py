"""The gateway's own Prometheus metrics (prometheus-client).

Which process exports which metric, and how to aggregate each over several api processes and
workers, is in docs/metrics.md. In short: live-request metrics belong to each api process (sum
them), line and server-load metrics to the worker that did the work (sum them), and the route
and stall gauges read from the workflows are exported alike by every worker's exporter
(`worker/exporter.py`): aggregate those with `max by (...)`, never `sum`. `provider` is the
route id.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)

LIVE_REQUEST_SECONDS = Histogram(
    "gateway_live_request_seconds",
    "Live request latency in this api process: time to the first body byte (ttft) and total.",
    ["route", "phase"],
    buckets=LATENCY_BUCKETS,
)
LINE_OUTCOMES = Counter(
    "gateway_batch_line_outcomes_total",
    "Batch lines finished (result committed), by outcome class: 2xx, 4xx, 5xx, error.",
    ["provider", "outcome"],
)
LINE_SECONDS = Histogram(
    "gateway_batch_line_seconds",
    "Time one batch line took, from its activity's start to its committed result.",
    ["provider"],
    buckets=LATENCY_BUCKETS,
)
PREEMPTED_LINES = Counter(
    "gateway_batch_preempted_lines_total",
    "Batch lines ended early to give their seat to live traffic (preemptive yield); each runs "
    "again later.",
    ["route"],
)
BUFFER_BYTES = Gauge(
    "gateway_buffer_bytes",
    "Bytes this process's buffers of a kind hold now, against its byte budget "
    "(docs/operator-guide.md, memory budget per process).",
    ["buffer"],
)
BUFFER_REFUSALS = Counter(
    "gateway_buffer_refusals_total",
    "Buffers refused room in this process's byte budget (a workspace's share or the total).",
    ["buffer"],
)
BATCH_SEATS_HELD_BACK = Gauge(
    "gateway_batch_seats_held_back",
    "Seats this worker holds back from the route's batch lines, beyond keep_free, to keep the "
    "route's live TTFT target (preemptive yield's live_ttft_target_ms).",
    ["route"],
)
REPORTING_PROCESSES = Gauge(
    "gateway_preempt_reporting_processes",
    "Api processes whose live counts this worker holds for the route (preemptive yield's "
    "channel; a process not heard from in 5 s is forgotten at the route's next report).",
    ["route"],
)
PREEMPT_ON = Gauge(
    "gateway_preempt_on",
    "1 while the route's preemptive yield is on, as this worker last read it from the route's "
    "scheduler (0: off).",
    ["route"],
)
PREEMPT_PEERS = Gauge(
    "gateway_preempt_peer_workers",
    "Other activity workers this worker sends its batch lines to (found polling the task "
    "queue), so each counts every line on a route when it preempts.",
)
PREEMPT_WORKERS = Gauge(
    "gateway_preempt_workers",
    "Activity workers preemptive yield's channel knows of (state=found: listed or polling the "
    "task queue now) and reaches (state=reached: the last live count sent was taken), in this "
    "api process.",
    ["state"],
)
PREEMPT_SEND_FAILURES = Counter(
    "gateway_preempt_send_failures_total",
    "Reports on preemptive yield's channel that did not reach a worker (path=live: an api "
    "process's live count; path=lines: a worker's lines to another; reason=unreachable: no "
    "answer in time, reason=refused: answered other than 204, e.g. 401 for a wrong token).",
    ["path", "reason"],
)
PREEMPT_ADDRESSES_IGNORED = Counter(
    "gateway_preempt_addresses_ignored_total",
    "Channel addresses found in task-queue poller identities and not used: outside "
    "BACKFILL_PREEMPT_NETWORKS, or not an IP address (counted at each look).",
)
PREEMPT_PEER_REPORTS_DROPPED = Counter(
    "gateway_preempt_peer_reports_dropped_total",
    "Other workers' lines reports this worker did not keep: reason=peers (the route already "
    "holds BACKFILL_PREEMPT_MAX_PEERS workers), reason=lines (they would take the route's other "
    "workers' lines beyond BACKFILL_PREEMPT_MAX_PEER_LINES).",
    ["route", "reason"],
)
WASTED_TOKENS = Counter(
    "gateway_batch_wasted_tokens_total",
    "Tokens preempted batch lines had generated and threw away: 0 for a line that keeps its "
    "partial answer (resume); counted from the stream for a streamed line that restarts; else "
    "estimated (time upstream x the route's tokens per second per line on that worker).",
    ["route"],
)
REPREFILL_TOKENS = Counter(
    "gateway_batch_reprefill_tokens_total",
    "Tokens sent again as prompt by resumed batch lines: the first prompt and the partial "
    "answer, each time a preempted line continues (mostly prefix-cache hits on vLLM).",
    ["route"],
)
SERVER_LOAD = Gauge(
    "gateway_server_load",
    "The last server-load reading of the route's model server, per signal.",
    ["provider", "signal"],
)
SERVER_LOAD_ERRORS = Counter(
    "gateway_server_load_errors_total",
    "Server-load readings that failed (metrics unreachable or unreadable).",
    ["provider"],
)
ROUTE_LINES = Gauge(
    "gateway_batch_route_lines",
    "Batch lines on the route: waiting (queued beyond allotments) or running.",
    ["provider", "state"],
)
PAUSED_ROUTES = Gauge(
    "gateway_batch_paused_routes",
    "Routes holding batch lines back, per reason.",
    ["reason"],
)
ROUTE_PAUSES = Counter(
    "gateway_batch_route_pauses_total",
    "Times a route started holding batch lines back for a reason.",
    ["reason"],
)
AT_RISK_BATCHES = Gauge(
    "gateway_batch_at_risk_batches",
    "In-progress batches whose expected finish at their recent pace is after expires_at, per "
    "route with lines of theirs still to finish (backfill.batches.eta).",
    ["provider"],
)
STALL_SECONDS = Gauge(
    "gateway_batch_stall_seconds",
    "Seconds an in-progress batch with lines to run has finished none, not counting "
    "legitimate waits.",
    ["batch", "workspace"],
)


def outcome_class(status_code: int | None, ok: bool) -> str:
    """`2xx`/`4xx`/`5xx` for an HTTP answer, `error` for none (transport, timeout, ...)."""
    if status_code is None:
        return "2xx" if ok else "error"
    if 200 <= status_code < 300:
        return "2xx"
    if 400 <= status_code < 500:
        return "4xx"
    if status_code >= 500:
        return "5xx"
    return "error"


STORE_UNAVAILABLE = Counter(
    "gateway_store_unavailable_total",
    "Attempts of a batch's validation or finalizing that failed on an unavailable file store "
    "(each is tried again until the batch's deadline), by step.",
    ["step"],
)
BATCHES_WAITING_ON_STORE = Gauge(
    "gateway_batches_waiting_on_store",
    "Batches whose validation or finalizing in this worker last failed on an unavailable file "
    "store and is being tried again (sum over workers).",
)
