"""RouteSchedulerWorkflow: one per route, the global cap on batch lines, shared fairly.

An entity workflow. Handlers only record; the main loop decides (with the pure functions in
`workflows.fairness`) and signals each batch its allotment when it changes. Batches keep that many
lines running without asking again, so a line completing adds nothing to this history.

The gates run through their registry (`backfill.routes.gates.registry`, docs/decisions/0040): their
states live in `SchedulerInput.gates`, their signals reach one dynamic handler, their reader
activities start and stop with demand, their patches are asked when each says; this module names
no gate.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RawValue, RetryPolicy
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from activities.control import ControlActivities
    from backfill.platform import refs
    from backfill.platform.messages import (
        Ack,
        Allotment,
        BatchSlot,
        ClosedBatchesInput,
        Demand,
        LiveGateView,
        SchedulerInput,
    )
    from backfill.routes import settings as route_settings
    from backfill.routes.gates import Gate, GateContext, GateEntry, registry
    from backfill.routes.gates.registry import ReaderRun
    from backfill.routes.settings import ConfiguredSettings, RouteSettings
    from backfill.routes.status import SchedulerStatus
    from workflows import patches
    from workflows.alarm import Alarm
    from workflows.fairness import (
        Claim,
        Holding,
        deadline_shares,
        fair_shares,
        fairness_order,
        plan_step,
    )
    from workflows.scheduler_view import (
        current_gate,
        effective_cap,
        gate_context,
        live_gate_view,
        scheduler_details,
        scheduler_status,
    )


@workflow.defn
class RouteSchedulerWorkflow:
    @workflow.init
    def __init__(self, input: SchedulerInput) -> None:
        # State from the input before any handler runs: signal-with-start delivers the first
        # demand in the same activation as the start.
        self._state = input
        self._dirty = True
        self._tick_due = False
        self._tick = Alarm(self._on_tick)
        self._gate_alarm = Alarm(self._on_gate_alarm)
        self._readers: dict[str, asyncio.Future[Any]] = {}
        """The gates' reader activities running, by gate name."""
        self._reading: dict[str, ReaderRun] = {}
        """What each was started with."""
        self._joined: set[str] = set()
        """The gates whose patch this run has taken (`GateEntry.patch`, asked when the gate's
        `joins` first holds): their state counts in decisions from then on."""
        self._limit: int | None = None
        """The gates' limit at the last decision (None: none, as on every route whose gates
        give no number): a change replans the fair shares."""

    @workflow.run
    async def run(self, input: SchedulerInput) -> None:
        while True:
            await workflow.wait_condition(lambda: self._dirty or self._tick_due)
            if self._tick_due:
                self._tick_due = False
                self._state.replan = True  # rotates uneven remainders
                await self._reconcile()
            self._dirty = False
            gate = self._decide()
            self._allocate(gate)
            await self._send_changes()
            self._arm_tick()
            # Time matters only while some batch waits: an idle route sets no timer.
            self._gate_alarm.set(gate.wake_at if self._has_demand else None)
            self._manage_readers()
            if workflow.info().is_continue_as_new_suggested() and not self._dirty:
                await self._stop_readers()  # in-flight activities do not survive it
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(self._state)

    def _on_tick(self) -> None:
        self._tick_due = True

    def _on_gate_alarm(self) -> None:
        self._dirty = True

    @property
    def _has_demand(self) -> bool:
        return any(b.wanted > 0 for b in self._state.batches.values())

    # ---- the gates' readers ----
    def _manage_readers(self) -> None:
        """Run each gate's reader (a long-running activity that reads what its decision needs
        and signals only when its reading changes, e.g. the server-load watcher) while its gate
        is on and some batch wants lines; restart it when its input changes."""
        wanted = registry.readers(self._state.settings, self._state.route_id)
        if not self._has_demand:
            wanted = {}
        for name in [e.name for e in registry.entries()]:
            self._manage_reader(name, wanted.get(name))

    def _manage_reader(self, name: str, wanted: ReaderRun | None) -> None:
        handle = self._readers.get(name)
        running = handle is not None and not handle.done()
        if running and wanted == self._reading.get(name):
            return
        if running:
            assert handle is not None
            handle.cancel()
        self._readers.pop(name, None)
        self._reading.pop(name, None)
        if wanted is None:
            return
        self._reading[name] = wanted
        handle = workflow.start_activity(
            wanted.activity,
            wanted.input,
            start_to_close_timeout=timedelta(days=30),
            heartbeat_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=30)),
            cancellation_type=ActivityCancellationType.TRY_CANCEL,
        )
        self._readers[name] = handle
        handle.add_done_callback(self._on_reader_done)

    def _on_reader_done(self, done: asyncio.Future[Any]) -> None:
        if not done.cancelled() and done.exception() is not None:  # retrieved: logged once here
            workflow.logger.info("gate reader ended: %s", done.exception())
        self._dirty = True  # restarted if still wanted

    async def _stop_readers(self) -> None:
        for name in [e.name for e in registry.entries()]:
            handle = self._readers.pop(name, None)
            self._reading.pop(name, None)
            if handle is not None and not handle.done():
                handle.cancel()
                with contextlib.suppress(BaseException):
                    await handle

    def _arm_tick(self) -> None:
        """Tick (reconcile, rotate) only while some batch is held back: then a vanished holder
        matters. An idle or uncontended route adds no events to history."""
        held_back = any(b.wanted > b.allotment for b in self._state.batches.values())
        if not held_back:
            self._tick.set(None)
        elif self._tick.at is None:
            self._tick.set(workflow.now().timestamp() + self._state.reconcile_seconds)

    # ---- handlers: record only ----
    @workflow.signal
    def demand(self, d: Demand) -> None:
        slot = self._state.batches.get(d.batch_id)
        if slot is None:
            if d.wanted <= 0:
                return
            self._state.seq += 1
            slot = BatchSlot(
                batch_id=d.batch_id, workspace=d.workspace, arrived=self._state.seq, epoch=d.epoch
            )
            self._state.batches[d.batch_id] = slot
        slot.epoch = max(slot.epoch, d.epoch)
        slot.weight = max(1, d.weight)
        if d.expires_at is not None:
            slot.expires_at = d.expires_at
        if d.line_seconds is not None:
            slot.line_seconds = d.line_seconds
        wanted = max(0, d.wanted)
        slot.wanted = wanted
        if wanted < slot.allotment:
            # The batch has already capped itself at `wanted` (it never runs more than it
            # reported), so the shrink needs no acknowledgement.
            slot.allotment = wanted
        slot.held = min(slot.held, max(wanted, slot.allotment))
        if wanted == 0 and slot.held == 0:
            del self._state.batches[d.batch_id]
        self._state.replan = True
        self._dirty = True

    @workflow.signal
    def ack(self, a: Ack) -> None:
        slot = self._state.batches.get(a.batch_id)
        if slot is None or a.epoch != slot.epoch or a.running > slot.allotment:
            return
        slot.held = slot.allotment
        if slot.wanted == 0 and slot.held == 0:
            del self._state.batches[a.batch_id]
        self._dirty = True

    @workflow.signal(dynamic=True)
    def gate_signal(self, name: str, args: Sequence[RawValue]) -> None:
        """A gate's signal (`GateEntry.signals`: an api process's live count, a rate-limited
        line, the server-load watcher's verdict, a worker's held-back seats, ...): recorded in
        that gate's state, by the gate's own rule."""
        found = registry.signal(name)
        if found is None:
            workflow.logger.warning("route %s: no gate takes signal %r", self._state.route_id, name)
            return
        entry, sig = found
        payload = workflow.payload_converter().from_payload(args[0].payload, sig.payload)
        now = workflow.now().timestamp()
        registry.apply_signal(self._state.gates, entry, sig, payload, now)
        self._dirty = True

    @workflow.query
    def live_gate(self) -> LiveGateView:
        return live_gate_view(self._state, workflow.now().timestamp())

    @workflow.signal
    def configure(self, c: ConfiguredSettings) -> None:
        """The config file's settings for the route, sent by each worker at start: applied when
        they differ from those last applied (decision 0039; patch `configured-settings`)."""
        s = self._state
        applied = route_settings.apply_config(s.settings, s.sources, s.configured, c)
        if applied is None or not workflow.patched(patches.CONFIGURED_SETTINGS):
            return
        s.sources, s.configured = applied.sources, applied.declared
        if applied.settings != s.settings:
            self._change_settings(applied.settings)

    @workflow.update
    def set_settings(self, settings: RouteSettings) -> RouteSettings:
        s = self._state
        s.sources = route_settings.after_put(s.settings, settings, s.sources)
        self._change_settings(settings)
        return settings

    def _change_settings(self, settings: RouteSettings) -> None:
        registry.on_settings_change(self._state.settings, settings, self._state.gates)
        self._state.settings = settings
        self._state.replan = True
        self._dirty = True

    @set_settings.validator
    def _validate_settings(self, settings: RouteSettings) -> None:
        RouteSettings.model_validate(settings.model_dump())

    @workflow.query
    def status(self, at: float | None = None) -> SchedulerStatus:
        """The route's state, gate and batches as of `at` (the caller's Unix time).

        Without it, as of the workflow's last task: an idle route sets no timer, so a back-off,
        a time window or live traffic that ended since would still show. `at` earlier than that
        task is ignored. The answer is a reading, not a decision: the gate the scheduler acts
        on is its own, on its own clock."""
        now = workflow.now()
        if at is not None and at > now.timestamp():
            now = datetime.fromtimestamp(at, UTC)
        return scheduler_status(self._state, self._gate(now), now.timestamp())

    # ---- decisions ----
    def _has_joined(self, entry: GateEntry[Any]) -> bool:
        return entry.name in self._joined

    def _context(self, now: datetime | None = None) -> GateContext:
        return gate_context(self._state, now or workflow.now(), self._has_joined)

    def _gate(self, now: datetime | None = None) -> Gate:
        """The gates' combined answer as of `now` (a reading: the status query asks it; the
        decision is `_decide`'s)."""
        return current_gate(self._state, self._context(now), self._has_joined)

    def _decide(self) -> Gate:
        """The gate the scheduler acts on now. A gate behind a patch joins when it first asks
        (`GateEntry.joins`; e.g. `seats-held-back` when a worker first reports seats held back,
        `reopen-ramp` while the ramp is on); the shaping gates' states are kept (the reopen
        ramp's next doubling is in `wake_at`, so the gate alarm wakes the scheduler for it)."""
        s = self._state
        at = workflow.now().timestamp()
        for entry in registry.entries():
            if (
                entry.patch is not None
                and entry.name not in self._joined
                and entry.wants_patch(s.settings, s.gates, at)
                and workflow.patched(entry.patch)
            ):
                self._joined.add(entry.name)
        context = self._context()
        gate = registry.route_gate(s.settings, context)
        gate, kept = registry.shaped(gate, s.settings, s.gates, context, self._has_joined)
        s.gates.update(kept)
        return gate

    def _allocate(self, gate: Gate) -> None:
        s = self._state
        if gate.reason != s.gate_reason:
            workflow.logger.info(
                "route %s: %s",
                s.route_id,
                f"paused ({gate.reason})" if gate.reason else "open",
                extra={"route": s.route_id, "reason": gate.reason},
            )
            s.gate_reason = gate.reason
            s.replan = True
        if gate.limit != self._limit:
            self._limit = gate.limit
            s.replan = True
        # A closed gate: every allotment drops to zero; running lines finish.
        cap = effective_cap(s.settings.max_concurrent_lines, gate)
        claims = [
            Claim(
                b.batch_id,
                b.workspace,
                b.wanted,
                b.held,
                b.last_served,
                b.weight,
                expires_at=b.expires_at,
                line_seconds=b.line_seconds,
            )
            for b in s.batches.values()
        ]
        if s.replan or set(s.targets) != set(s.batches):
            s.targets = self._shares(cap, claims)
            s.replan = False
        step = plan_step(
            cap,
            s.targets,
            [Holding(b.batch_id, b.allotment, b.held) for b in s.batches.values()],
            fairness_order(claims),
        )
        for batch_id in step.raised:
            s.seq += 1
            s.batches[batch_id].last_served = s.seq
        for batch_id, slot in s.batches.items():
            allotment = step.allotments.get(batch_id, slot.allotment)
            if allotment != slot.allotment:
                workflow.logger.info(
                    "route %s: batch %s (%s) allotment %d -> %d",
                    s.route_id,
                    batch_id,
                    slot.workspace,
                    slot.allotment,
                    allotment,
                    extra={"route": s.route_id, "batch_id": batch_id, "workspace": slot.workspace},
                )
            slot.allotment = allotment
            slot.held = step.held.get(batch_id, slot.held)
        # The UI's current details (no command: a query answers them).
        status = scheduler_status(s, gate, workflow.now().timestamp())
        workflow.set_current_details(scheduler_details(status))

    def _shares(self, cap: int, claims: list[Claim]) -> dict[str, int]:
        """Target allotments: fair, with deadlines heeded within each workspace (patch
        `deadline-aware-shares`, asked only when heeding them changes a target)."""
        fair = fair_shares(cap, claims)
        aware = deadline_shares(cap, claims, workflow.now().timestamp())
        if aware != fair and workflow.patched(patches.DEADLINE_AWARE_SHARES):
            return aware
        return fair

    async def _send_changes(self) -> None:
        priority = self._state.settings.priority_hint
        changed = [
            b
            for b in self._state.batches.values()
            if b.allotment != b.sent or b.sent_priority != priority
        ]
        for slot in changed:
            slot.epoch += 1
            slot.sent = slot.allotment
            slot.sent_priority = priority
        if not changed:
            return
        results = await _gather(
            [
                workflow.get_external_workflow_handle(slot.batch_id).signal(
                    refs.BatchWorkflow.set_allotment,
                    Allotment(
                        route_id=self._state.route_id,
                        epoch=slot.epoch,
                        lines=slot.sent,
                        priority=priority,
                    ),
                )
                for slot in changed
            ]
        )
        for slot, err in zip(changed, results, strict=True):
            if err is not None:
                workflow.logger.info("batch %s is gone (%s): slots reclaimed", slot.batch_id, err)
                self._forget(slot.batch_id)

    async def _reconcile(self) -> None:
        ids = sorted(self._state.batches)
        if not ids:
            return
        out = await workflow.execute_activity_method(
            ControlActivities.find_closed_batches,
            ClosedBatchesInput(batch_ids=ids),
            start_to_close_timeout=timedelta(seconds=30),
        )
        for batch_id in out.closed:
            workflow.logger.info("batch %s closed while holding slots: reclaimed", batch_id)
            self._forget(batch_id)

    def _forget(self, batch_id: str) -> None:
        self._state.batches.pop(batch_id, None)
        self._state.replan = True
        self._dirty = True


async def _gather(coros: list[Awaitable[None]]) -> list[BaseException | None]:
    results = await asyncio.gather(*coros, return_exceptions=True)
    return [r if isinstance(r, BaseException) else None for r in results]
