"""Every `workflow.patched` id of the workflows, with its history: what changed, and which runs
still take the old branch.

A workflow change that would record different commands for a running batch is guarded by a
patch: a run that started before it replays the old branch, a new run records the patch's marker
and takes the new one. Batches live up to 168 hours, so each old branch stays until no run older
than its patch can exist; how and when a patch is retired is docs/decisions/0019. The saved
histories in tests/workflows/histories (named below per patch) replay both branches.

Each id is asked where the two branches differ and nowhere else: asking records a marker, and a
marker where the old code recorded none would break the replay of runs that started before it.
Grouped by workflow: the batch's, the route scheduler's, the alarm's.
"""

from __future__ import annotations

# ---- BatchWorkflow ----
CANCEL_REQUEST_KEEPS_RESULTS = "cancel-request-keeps-results"
"""A Temporal cancellation request (the UI's Cancel, `temporal workflow cancel`) that lands while
the main task awaits an activity or a condition cancels the batch like the `cancel` signal: the
activity runs to its end, running lines finish, the batch ends `cancelled` with its files; a line
activity cancelled with the workflow is neither counted nor requeued (workflows/cancellation.py,
docs/decisions/0008). Old branch: the request cancelled the awaited activity and the run closed
as cancelled, without files. Histories: `batch_cancel_requested_unpatched_*` (old),
`batch_cancel_requested_*` (new). Commit a9158cd."""

ROUTE_WIDE_BACKOFF = "route-wide-backoff"
"""A rate-limited line (429, 503, refused) also signals the route's scheduler (`rate_limited`),
so every batch on the route backs off, not only this one. Old branch: no signal; only the
batch's own lane backed off. Added after batches were running. Commit b335a6f."""

LANE_HONOURS_RETRY_AFTER = "lane-honours-retry-after"
"""A Retry-After also holds the batch's own lane that long. Old branch: the lane waited 1 s
doubling and only the scheduler's route-wide back-off honoured Retry-After, so a next line could
start before the scheduler's signal arrived. Commit 60a188e."""

ALARMS_ON_TIME = "alarms-on-time"
"""The batch's alarm never rings for a deadline already passed. Old branch: (1) a keep-alive's
deadline was compared in whole seconds, so for up to a second after it the alarm, already past,
rang again on a one-millisecond timer: hundreds of timers per hourly keep-alive while a batch
waited for a slot (a 36-hour wait for a time window grew a 3-line batch to 21,614 events); (2) a
paused, ending or draining batch kept a passed back-off as its next deadline and rang for it
every millisecond until it resumed or ended; (3) a deadline passed during the loop's own awaits
cost a one-millisecond timer. New: keep-alives compare exact times, back-offs count only while
lines may start, and a passed deadline rings in the same activation. Asked only where the two
rules answer differently (`BatchWorkflow._set_alarm`, `scheduler_link.reached`). History:
`batch_paused_in_backoff.v1`. Commit 3c24112."""

STATUS_MEMO = "status-memo"
"""Each status change also upserts the batch's compact status into its memo
(`backfill.batches.lifecycle.STATUS_MEMO`), so the api answers a retrieve without a worker. A new
command: runs from before it replay without it. Commit b324be0."""

CONTINUE_AS_NEW_BY_HISTORY = "continue-as-new-by-history"
"""A run continues as new when Temporal suggests it or its history reaches `run_length`'s
bounds, so a batch has as few runs as the server's thresholds allow. Old branch: a run also
drained after `LINES_PER_RUN` lines. Histories: `lines_per_run_20/` (old, recorded with
`LINES_PER_RUN` lowered to 20), `batch_paused_in_backoff.v1` (new). Commit 4342cd4."""

WEBHOOK_EVENTS = "webhook-events"
"""A batch that reaches a terminal status (`failed` at validation too) hands its webhook event
over just before it closes (`workflows.webhooks.announce`: the `announce_webhook_event` activity,
which starts the event's delivery workflow when an endpoint is subscribed). Old branch: no
event; the run closes right after its last status. Histories: every one recorded before it
(old), `batch_completed_announced.v1` and `batch_failed_announced.v1` (new)."""

PREEMPTED_LINE_REQUEUED = "preempted-line-requeued"
"""A line outcome `preempted` (preemptive yield: the worker closed the line's upstream request to
give its seat to live traffic, committing nothing) puts the line back at the front of its lane's
queue, without back-off and without counting a retry; `Tries.preempted` counts it. Asked only
for such an outcome, which no worker returned before: every older history replays without it.
Old branch (unreachable in recorded histories): the outcome was taken as a finished line."""

HELD_LINE_REQUEUED = "held-line-requeued"
"""A line outcome `held` (preemptive yield: the line waited at its worker's door, never sent, as
long as a run may wait) goes back to the front of its lane's queue with nothing counted: no
preemption, retry or loss (waiting is not a try). Asked only for such an outcome, which no
worker returned before. Old branch (unreachable in recorded histories): it was taken as a
preemption, counted in `Tries.preempted` and the lane's `preempted_lines`. History:
`batch_held_at_door.v1`."""

DEADLINE_PACE_COUNTED = "deadline-pace-counted"
"""A batch's demand carries its `expires_at` and the lane's mean line time (`Lane.line_seconds`),
and is also reported when the scheduler's view of them is out of date
(`backfill.batches.lanes.pace_to_report`: the first line finished, the lines left fallen by a
quarter, twice the lines finished since the mean was last reported), so the route scheduler can heed
the deadline (`deadline-aware-shares`, docs/decisions/0038). Asked where a demand is reported or
would be only for this. Old branch: the demand said neither, and was reported only as
`demand_to_report` says. History: `batch_pace_counted.v1`.

Never to be reused: `deadline-pace-reported`, the id of a first version (never released, main
only from 14:42 to its revert on 2026-12-02) that also reported when the mean line time moved by
a quarter. Whether it scheduled a report then depended on the times the activations saw, and a
replay on another worker failed with a nondeterminism error (docs/decisions/0038)."""

STORE_OUTAGE_WAITS = "store-outage-waits"
"""Validation and finalizing wait out an unavailable file store until the batch's deadline
(`backfill.batches.storage_waits`: retried at most 30 s apart, for at least 24 h), and a batch whose
validation or finalizing fails for good (the deadline passed, or an error waiting cannot mend)
ends `failed` with a `store_unavailable` / `store_error` error, its webhook event sent, instead
of its run failing; its stored work is left to the retention pass
(`activities.retention.drop_ended_work`, docs/decisions/0047). Asked where either activity is
scheduled.
Old branch: 3 attempts of validation and 5 of finalizing with Temporal's default back-off
(~15 s), then the run failed (the api read a failed run as `failed`, without files). History:
`batch_store_failed.v1` (new); every older one replays the old branch."""

LINES_PER_RUN = 2_000
"""The old branch of `CONTINUE_AS_NEW_BY_HISTORY`: runs from before it continued as new after
this many lines finished in one run. Kept only so they replay."""

# ---- RouteSchedulerWorkflow ----
REOPEN_RAMP = "reopen-ramp"
"""With the route's `reopen_ramp` setting on, a rise of the route's limit (a gate reopening,
seats freeing up, the cap raised) restarts lines at the ramp's pace (`backfill.routes.gates.ramp`):
the allotments grow by doublings, each woken by the scheduler's gate timer. Asked only while the
setting is on, which no route had before: every older history replays without it. Old branch
(unreachable in recorded histories): the limit followed the gates at once. History:
`route_scheduler_reopen_ramp.v1`."""

SEATS_HELD_BACK = "seats-held-back"
"""The seat-aware allotment leaves out the seats the workers hold back for preemptive yield's
live-latency target (their `report_held_back` signals, `backfill.routes.gates.seats`), so lines that
could only wait at a worker's door are not allotted. Asked the first time a worker reports
seats held back, which no worker did before: every older history replays without it. Old
branch (unreachable in recorded histories): the allotment followed `seats − keep_free` only.
History: `route_scheduler_held_back.v1`."""

DEADLINE_AWARE_SHARES = "deadline-aware-shares"
"""Within a workspace, a batch whose fair share cannot finish its lines before it expires (its
demand says when it expires and how long its lines take) is given, earliest deadline first, the
slots it needs; the rest of the workspace's share is split fairly (`fairness.deadline_shares`,
docs/decisions/0038). Asked only when those targets differ from the fair ones, which needs a
demand carrying a deadline and a pace, which no batch sent before: every older history replays
without it. Old branch (unreachable in recorded histories): fair shares whatever the deadlines.
History: `route_scheduler_deadline.v1`."""

CONFIGURED_SETTINGS = "configured-settings"
"""The `configure` signal (a worker at start sends the route's `settings` table from the config
file) changes the settings when the table differs from the one last applied
(`backfill.routes.settings.apply_config`, docs/decisions/0039). Asked only when the signal would
change something, which no worker sent before: every older history replays without it. Old
branch (a signal handled by a worker from before: unreachable in recorded histories): the
signal was left unhandled. History: `route_scheduler_configured.v1`."""

# ---- Alarm (workflows/alarm.py) ----
ALARM_KEEPS_DUE_TIMERS = "alarm-keeps-due-timers"
"""A timer due within `alarm.DUE_SOON_S` is left to fire (and ignored) instead of cancelled: the
time-skipping test server strands a run whose task cancels a timer that fired meanwhile
(temporalio/sdk-java#3088). Old branch: the timer was cancelled. Commit a895365."""

# ---- AdmissionWorkflow ----
ADMISSION_CHECKS_YOUNG_RESERVATIONS = "admission-checks-young-reservations"
"""Each check of the workspace's reservations asks about every batch, not only those reserved
60 s ago or more, and frees one whose batch ran and ended however young its reservation; a young
one whose batch Temporal does not know yet is still kept (`backfill.tenancy.admission.to_drop`). Old
branch: young reservations were not checked, so a slot came back 60-90 s after a short batch
ended. Asked only when some reservation is young (otherwise both branches check the same ids).
No saved history (the replay test covers the batch and scheduler workflows):
tests/e2e/test_admission_slot.py covers the new branch, tests/unit/test_admission.py the rule."""
