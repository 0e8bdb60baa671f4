"""The real stack for e2e tests: the session's dev server, the simulator, and the worker and api
as separate processes (`python -m tools worker|api`), each test with its own task queue,
routes, data directory, ports and workspaces.

Stacks share one dev server and namespace, so everything that lives there is the stack's own:
routes and task queue carry a random suffix, and so do the workspaces (`alpha-<suffix>`), which
is what batch listings filter by. A test may therefore count on a workspace holding exactly the
batches it made, whatever ran before it. The api keys (`sk-test-alpha`, ...) are read by each
stack's own api from its own config, so they never meet another stack's.

`stop()` kills the stack's processes and terminates every workflow still running on its task
queue (batches, admission, route schedulers), so nothing a test started keeps running into the
next one.

A shared stack (`SharedStacks`, the `shared_stack` and `lease_stack` fixtures) is one set of
processes per distinct set of options for the whole session, holding `tenants` key sets. Each test
leases one (`lease()`): a `Stack` with the same api, workers, routes and simulators, and its own
keys and workspaces (`stack.key("sk-test-alpha")`, `stack.auth(...)`, `stack.client(...)` translate
the names of KEYS), a simulator reset to its first state (stats, seen requests, faults, config),
and at its end the lease's batches ended. What a lease cannot isolate stays with `make_stack`:
processes (kills, restarts, worker roles), route settings changed at run time, the route
scheduler's history and the processes' metrics.

The file store is the local directory `<tmp>/data`, or, with `BACKFILL_TEST_STORE=s3` in the
environment, an S3 bucket on moto's server (one child process per test session, started by the
first stack), each stack under its own key prefix. Tests look into the store through
`stack.store()`, the same `Store` interface the api and workers use."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import os
import secrets
import tempfile
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from backfill.batches.search_attributes import WORKSPACE
from backfill.files import FileStore, Store
from backfill.files.s3 import S3Store
from backfill.platform.config import hash_key
from backfill.platform.ids import scheduler_workflow_id
from backfill.platform.refs import RouteSchedulerWorkflow
from backfill.preemption.signing import MIN_TOKEN_LENGTH
from tests.polling import PollTimeout, poll_until
from tests.s3server import BUCKET, CREDENTIALS, REGION, MotoProcess
from tests.s3server import client as s3_client
from tools.dev.devserver import connect_client
from tools.dev.procs import Child, backfill_argv, free_port
from tools.sim import SimConfig, SimServer
from tools.sim.faults import FaultInjector
from tools.sim.server import SimStats
from workflows.batch import BatchWorkflow

log = logging.getLogger(__name__)

API_KEY = "sk-test-alpha"
KEYS = {
    "sk-test-alpha": ("alpha", "member"),
    "sk-test-beta": ("beta", "member"),
    "sk-test-gamma": ("gamma", "member"),
    "sk-test-admin": ("ops", "platform_admin"),
    "sk-test-auditor": ("audit", "auditor"),
    "sk-test-limited": ("limited", "member"),
}
KEY_MODELS = {"sk-test-limited": ["other"]}
"""Keys restricted to some models (the others may use every model)."""
S3_PART_BYTES = 5 * 1024 * 1024
"""The smallest part S3 allows: uploads of more than this go multipart in the e2e runs."""

_moto: MotoProcess | None = None


def store_kind() -> str:
    """`local` or `s3`: the store the e2e stacks run on (`BACKFILL_TEST_STORE`)."""
    kind = os.environ.get("BACKFILL_TEST_STORE", "local")
    if kind not in ("local", "s3"):
        raise ValueError(f"BACKFILL_TEST_STORE must be local or s3, not {kind!r}")
    return kind


def moto_server() -> MotoProcess:
    """The session's moto S3 server, started on first use (stopped by `stop_moto`)."""
    global _moto
    if _moto is None:
        log_path = Path(tempfile.gettempdir()) / f"backfill-e2e-moto-{os.getpid()}.log"
        _moto = MotoProcess(log_path).start()
    return _moto


def stop_moto() -> None:
    global _moto
    if _moto is not None:
        _moto.stop()
        _moto = None


class Stack:
    def __init__(
        self,
        tmp: Path,
        temporal_address: str,
        *,
        cap: int = 4,
        sim: SimConfig | None = None,
        extra_routes: int = 0,
        limits: dict[str, Any] | None = None,
        reconcile_seconds: float = 2.0,
        extra_env: dict[str, str] | None = None,
        upstream_key: str | None = None,
        sim_per_route: bool = False,
        route_extra: dict[str, Any] | None = None,
        workspace_limits: dict[str, dict[str, int]] | None = None,
        preempt_token: str | bool | None = None,
        tenants: int = 0,
        route_settings: dict[str, Any] | None = None,
    ) -> None:
        """`upstream_key`: the routes' credential (through `api_key_env`), else none.
        `preempt_token`: preemptive yield's direct channel on (every process gets the token,
        at least `MIN_TOKEN_LENGTH` characters; True: a fresh one; the api processes and the
        workers find the workers on the task queue, on loopback), else off; `self.preempt_token`
        is the token, for a test's own reports (`backfill.preemption.signing.sign`).
        `tenants`: key sets for leases (a shared stack), each with its own keys and workspaces,
        besides the stack's own KEYS."""
        self.tmp = tmp
        self.temporal_address = temporal_address
        self.cap = cap
        # The stack's own copy: a test changes its simulator's config at run time (a lease's
        # latency, say), which must not change the options it was made from (the key a shared
        # stack is found by, and the first state the next lease is reset to).
        sim = (sim or SimConfig(model_names=[], latency_ms=5)).model_copy(deep=True)
        self.sim = SimServer(sim)
        self.suffix = secrets.token_hex(4)
        self.route_id = f"sim-{self.suffix}"
        self.routes = [self.route_id] + [f"sim{i}-{self.suffix}" for i in range(extra_routes)]
        # With sim_per_route, each route has its own simulator (same config), so each route's
        # traffic is measured at its own upstream; otherwise all routes share `sim`.
        self.route_sims = {
            route: SimServer(sim.model_copy(deep=True)) if sim_per_route and i else self.sim
            for i, route in enumerate(self.routes)
        }
        self.task_queue = f"tq-{self.suffix}"
        self.api_port = free_port()
        self.limits = limits or {}
        self.reconcile_seconds = reconcile_seconds
        self.extra_env = dict(extra_env or {})
        self.upstream_key_env = (
            f"BACKFILL_TEST_UPSTREAM_KEY_{self.suffix}" if upstream_key else None
        )
        if upstream_key and self.upstream_key_env:
            self.extra_env[self.upstream_key_env] = upstream_key
        if preempt_token is True:
            preempt_token = secrets.token_hex(32)
        self.preempt_token = preempt_token or None
        if self.preempt_token:
            assert len(self.preempt_token) >= MIN_TOKEN_LENGTH, "the processes would refuse it"
            self.extra_env["BACKFILL_PREEMPT_TOKEN"] = self.preempt_token
        self.workers: list[Child] = []
        self.worker_metrics_ports: list[int] = []
        """Each worker's `/metrics` port, in `workers` order."""
        self.api = Child("api")
        self.config_path = tmp / "backfill.toml"
        self.route_extra = route_extra or {}
        """More keys of every route's config table (e.g. api_key_env)."""
        self.route_settings = route_settings
        """Every route's `[models.routes.settings]` table (settings as code), else none."""
        self.workspaces = {ws: f"{ws}-{self.suffix}" for ws, _ in KEYS.values()}
        self.keys = {key: key for key in KEYS}
        """The key each name of KEYS stands for on this stack (a lease has keys of its own)."""
        self.tenants = [
            (
                {key: f"{key}-t{i}" for key in KEYS},
                {ws: f"{ws}-{self.suffix}-t{i}" for ws, _ in KEYS.values()},
            )
            for i in range(tenants)
        ]
        """(keys, workspaces) of each lease this stack can give (`lease`)."""
        self.leased = 0
        self.lease_of: Stack | None = None
        """The shared stack this is a lease of, else None (the stack's own processes)."""
        self.sim_first_state = [(sim, sim.app.config.model_copy(deep=True)) for sim in self.sims]
        self.workspace_limits = workspace_limits or {}
        """`[workspaces.<name>]` tables by short workspace name (`alpha`, or `default`)."""
        self.store_kind = store_kind()
        self.s3_url = moto_server().url if self.store_kind == "s3" else None
        self.s3_prefix = f"stack-{self.suffix}/"

    @property
    def sims(self) -> list[SimServer]:
        """Every simulator of this stack, each once."""
        return list({id(s): s for s in self.route_sims.values()}.values())

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def env(self) -> dict[str, str | None]:
        return {
            "BACKFILL_CONFIG": str(self.config_path),
            "TEMPORAL_ADDRESS": self.temporal_address,
            "BACKFILL_TASK_QUEUE": self.task_queue,
            "BACKFILL_API_PORT": str(self.api_port),
            "BACKFILL_DATA_DIR": str(self.tmp / "data"),
            "BACKFILL_LOG_LEVEL": "WARNING",
            "BACKFILL_DEV_STACK": "1",  # a test stack is a development stack
            "BACKFILL_SCHEDULER_RECONCILE_SECONDS": str(self.reconcile_seconds),
            # No retention Schedule per test stack on the shared server (test_retention's own).
            "BACKFILL_CLEANUP_INTERVAL_SECONDS": "0",
            **self.store_env(),
            **self.extra_env,
        }

    def store_env(self) -> dict[str, str]:
        """The S3 settings and (fake) credentials, or nothing for the local store."""
        if self.s3_url is None:
            return {}
        return {
            "BACKFILL_STORE": "s3",
            "BACKFILL_S3_ENDPOINT_URL": self.s3_url,
            "BACKFILL_S3_BUCKET": BUCKET,
            "BACKFILL_S3_PREFIX": self.s3_prefix,
            "BACKFILL_S3_REGION": REGION,
            "BACKFILL_S3_PART_BYTES": str(S3_PART_BYTES),
            **CREDENTIALS,
        }

    def store(self) -> Store:
        """The stack's file store, as its api and workers see it."""
        if self.s3_url is None:
            return FileStore(self.tmp / "data")
        return S3Store(s3_client(self.s3_url), BUCKET, self.s3_prefix, S3_PART_BYTES)

    def s3_object(self, name: str) -> bytes:
        """The bytes of one object of the stack's store (`name` as `store().keys` gives it)."""
        assert self.s3_url is not None
        resp = s3_client(self.s3_url).get_object(Bucket=BUCKET, Key=self.s3_prefix + name)
        return resp["Body"].read()  # type: ignore[no-any-return]

    def write_config(self) -> None:
        """(Re)write the config file from routes, cap, limits and keys (read at process start)."""
        if self.lease_of is not None:
            raise RuntimeError("a lease shares its stack's processes: use make_stack for your own")
        lines = ["[limits]"] + [f"{k} = {v!r}" for k, v in self.limits.items()]
        lines += ["[[models]]", 'id = "demo"']
        for route in self.routes:
            lines += [
                "[[models.routes]]",
                f'id = "{route}"',
                f'base_url = "{self.route_sims[route].base_url}"',
                f"max_concurrent_lines = {self.cap}",
            ]
            if self.upstream_key_env:
                lines.append(f'api_key_env = "{self.upstream_key_env}"')
            lines += [f"{k} = {json.dumps(v)}" for k, v in self.route_extra.items()]
            if self.route_settings is not None:
                lines += toml_tables("models.routes.settings", self.route_settings)
        key_sets = [(self.keys, self.workspaces), *self.tenants]
        for keys, workspaces in key_sets:
            for key, (ws, role) in KEYS.items():
                lines += ["[[api_keys]]", f'sha256 = "{hash_key(keys[key])}"']
                lines += [f'workspace = "{workspaces[ws]}"']
                lines += [f'role = "{role}"', f'name = "{ws}-key"']
                if key in KEY_MODELS:
                    lines.append(f"models = {json.dumps(KEY_MODELS[key])}")
        # The listing test keeps 105 batches in one workspace: above the shipped default of 100.
        lines += ["[workspaces.default]", "max_active_batches = 1000"]
        for ws, table in self.workspace_limits.items():
            names = [self.workspaces.get(ws, ws)] + [w[ws] for _, w in self.tenants if ws in w]
            for name in names:
                lines.append(f'[workspaces."{name}"]')
                lines += [f"{k} = {v!r}" for k, v in table.items()]
        self.config_path.write_text("\n".join(lines) + "\n")

    async def start(self, workers: int = 1) -> Stack:
        if self.lease_of is not None:
            raise RuntimeError("a lease shares its stack's processes: use make_stack for your own")
        for sim in self.sims:
            await sim.start()
        self.write_config()
        for _ in range(workers):
            self.start_worker()
        await self.start_api()
        if workers:
            await self.wait_polled()
        return self

    async def start_api(self, tries: int = 3) -> None:
        """The api on `api_port`, healthy. The port was free when it was picked, but any process
        may take it before the api binds it (an outgoing connection's source port is any free
        port: "[Errno 98] address already in use" failed a clean-clone run), so an api that
        exits on that starts again on another free port, at most `tries` times."""
        log = self.tmp / "api.log"
        for attempt in range(1, tries + 1):
            since = log.stat().st_size if log.exists() else 0
            self.api.start(backfill_argv("api"), self.env(), log)
            try:
                await self.wait_healthy()
                return
            except RuntimeError:
                taken = "address already in use" in log.read_bytes()[since:].decode(
                    errors="replace"
                )
                if not taken or self.api.running or attempt == tries:
                    raise
            self.api_port = free_port()

    async def wait_polled(self, within: float = 60) -> None:
        """Until a worker polls the stack's task queue for workflow tasks: creating a batch
        needs the admission workflow's answer (decision 0027), so a test's first create must
        not race the worker's start."""
        temporal = await connect_client(self.temporal_address)
        request = DescribeTaskQueueRequest(
            namespace=temporal.namespace,
            task_queue=TaskQueue(name=self.task_queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
        )

        async def pollers() -> int:
            return len((await temporal.workflow_service.describe_task_queue(request)).pollers)

        await poll_until(
            pollers, timeout=within, what=f"a worker polling {self.task_queue}", interval=0.2
        )

    @contextlib.asynccontextmanager
    async def running(self, workers: int = 1) -> AsyncIterator[Stack]:
        """Started for the body of the `with`, stopped after it (also on failure). When the body
        failed, a failure to stop (Temporal stopped by the test, say) is added as a note to the
        body's error instead of replacing it, so the report shows what went wrong first."""
        try:
            yield await self.start(workers)
        except BaseException as failed:
            try:
                await self.stop()
            except Exception as stopping:  # noqa: BLE001 - reported with the body's error
                failed.add_note(f"(and stopping the stack failed too: {stopping!r})")
            raise
        await self.stop()

    def start_worker(self, extra_env: dict[str, str] | None = None) -> Child:
        if self.lease_of is not None:
            raise RuntimeError("a lease shares its stack's processes: use make_stack for your own")
        child = Child(f"worker{len(self.workers)}")
        port = free_port()
        env = {**self.env(), "BACKFILL_WORKER_METRICS_PORT": str(port), **(extra_env or {})}
        child.start(backfill_argv("worker"), env, self.tmp / f"{child.name}.log")
        self.worker_metrics_ports.append(port)
        self.workers.append(child)
        return child

    async def wait_healthy(self, within: float = 60, *, temporal: bool = True) -> None:
        """Until /healthz answers 200 and (unless `temporal` is False) says Temporal is
        connected."""
        async with httpx.AsyncClient(timeout=10) as http:

            async def healthy() -> bool:
                if not self.api.running:
                    raise RuntimeError(f"api exited: {self._log('api')}")
                resp = await http.get(f"{self.api_url}/healthz")
                return resp.status_code == 200 and (not temporal or resp.json()["status"] == "ok")

            await poll_until(
                healthy,
                timeout=within,
                what=f"{self.api_url}/healthz to answer 200"
                + (" with Temporal connected" if temporal else ""),
                interval=0.2,
                ignore=(httpx.HTTPError,),
            )

    def _log(self, name: str) -> str:
        path = self.tmp / f"{name}.log"
        return path.read_text()[-3000:] if path.exists() else ""

    def key(self, name: str = API_KEY) -> str:
        """The key `name` (one of KEYS) stands for on this stack; any other string as is."""
        return self.keys.get(name, name)

    def auth(self, name: str = API_KEY) -> dict[str, str]:
        """The Authorization header of `key(name)`."""
        return auth(self.key(name))

    def client(self, key: str = API_KEY) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            api_key=self.key(key), base_url=f"{self.api_url}/v1", max_retries=0
        )

    def lease(self) -> Stack:
        """The next of this started stack's tenants: a `Stack` on the same processes, routes
        and simulators with its own keys and workspaces. `stop()` on it ends its batches only."""
        if self.lease_of is not None or self.leased >= len(self.tenants):
            raise RuntimeError(f"stack {self.suffix} has no tenant left to lease")
        leased = copy.copy(self)
        leased.keys, leased.workspaces = self.tenants[self.leased]
        leased.lease_of = self
        self.leased += 1
        leased.reset_sims()
        return leased

    def reset_sims(self) -> None:
        """Each simulator back to its first state: config, stats, seen requests, faults."""
        for sim, first in self.sim_first_state:
            app = sim.app
            for name in type(first).model_fields:
                setattr(app.config, name, copy.deepcopy(getattr(first, name)))
            app.stats = SimStats()
            app.stats.reset(app.load)
            app.seen.clear()
            app.faults = FaultInjector(app.config.faults, seed=app.config.seed)

    async def stop(self) -> None:
        if self.lease_of is not None:
            await self.end_batches(workspaces=list(self.workspaces.values()))
            await poll_until(  # so the next lease's fresh stats count no request of this one
                lambda: sum(sim.app.stats.all.concurrent for sim in self.sims),
                lambda n: n == 0,
                timeout=60,
                what=f"no request of the lease's batches still open at stack {self.suffix}",
                interval=0.05,
            )
            # Its own batches, and any an earlier lease left behind (created too late to be
            # listed when it ended), are cancelled if a route still counts them.
            done = self.lease_of.tenants[: self.lease_of.leased]
            await self.wait_routes_idle(cancel=[ws for _, w in done for ws in w.values()])
            return
        try:
            # Its processes go at once (SIGKILL: no test asserts on how a teardown exits; the
            # graceful shutdown tests stop their processes themselves), then every workflow
            # still running on its task queue is terminated, so nothing the test started keeps
            # running into the next one, and no worker is needed for that.
            await asyncio.gather(
                *(asyncio.to_thread(child.kill) for child in [self.api, *self.workers])
            )
            await self.terminate_workflows()
        finally:
            for sim in self.sims:
                await sim.stop()

    async def terminate_workflows(self) -> None:
        """Terminate every running workflow of the stack's task queue (its batches, admission
        and route schedulers) and every route scheduler it had, all at once."""
        temporal = await connect_client(self.temporal_address)
        query = f"TaskQueue = '{self.task_queue}' AND ExecutionStatus = 'Running'"
        ids = {ex.id async for ex in temporal.list_workflows(query)}
        ids |= {scheduler_workflow_id(route) for route in self.route_sims}  # also those removed

        async def terminate(workflow_id: str) -> None:
            with contextlib.suppress(RPCError):  # never started, or already ended
                await temporal.get_workflow_handle(workflow_id).terminate("test stack stopped")

        await asyncio.gather(*(terminate(workflow_id) for workflow_id in sorted(ids)))

    async def wait_routes_idle(self, within: float = 60, *, cancel: Sequence[str] = ()) -> None:
        """Until no route scheduler of the stack counts a batch or a held slot (an ended batch
        leaves with its goodbye signal, a terminated one at the scheduler's next reconciliation),
        so the next lease finds every slot free. A batch of a workspace in `cancel` that a
        scheduler still counts is cancelled on the way: the visibility index `end_batches`
        lists by can lag behind a batch created at the end of a test (on a held route such a
        batch would otherwise wait for ever)."""
        temporal = await connect_client(self.temporal_address)
        cancelled: set[str] = set()

        async def cancel_batch(batch_id: str) -> None:
            handle = temporal.get_workflow_handle_for(BatchWorkflow.run, batch_id)
            with contextlib.suppress(RPCError):  # it may have ended meanwhile
                await handle.signal(BatchWorkflow.cancel)

        async def batches_on_routes() -> list[str]:
            held = []
            for route in self.routes:
                handle = temporal.get_workflow_handle_for(
                    RouteSchedulerWorkflow.run, scheduler_workflow_id(route)
                )
                try:
                    st = await handle.query(RouteSchedulerWorkflow.status)
                except RPCError as err:
                    if err.status != RPCStatusCode.NOT_FOUND:
                        raise
                    continue  # never started: nothing on it
                held += [b.batch_id for b in st.batches] + [f"{st.held} slots"] * bool(st.held)
                late = {b.batch_id for b in st.batches if b.workspace in cancel} - cancelled
                cancelled.update(late)
                await asyncio.gather(*(cancel_batch(batch_id) for batch_id in sorted(late)))
            return held

        await poll_until(
            batches_on_routes,
            lambda held: not held,
            timeout=within,
            what=f"the route schedulers of stack {self.suffix} to count no batch",
            interval=0.2,
        )

    async def end_batches(self, workspaces: list[str], within: float = 90) -> None:
        """Cancel the running batches of these workspaces (a lease's) and wait until they ended,
        terminating what did not end in time. The signals and the checks go out together."""
        temporal = await connect_client(self.temporal_address)
        names = ", ".join(f"'{ws}'" for ws in workspaces)
        query = (
            f"TaskQueue = '{self.task_queue}' AND ExecutionStatus = 'Running'"
            f" AND {WORKSPACE.name} IN ({names})"
        )
        running = [ex async for ex in temporal.list_workflows(query)]
        batches = [ex.id for ex in running if ex.workflow_type == "BatchWorkflow"]

        async def cancel(batch_id: str) -> None:
            handle = temporal.get_workflow_handle_for(BatchWorkflow.run, batch_id)
            with contextlib.suppress(RPCError):  # it may have ended meanwhile
                await handle.signal(BatchWorkflow.cancel)

        await asyncio.gather(*(cancel(batch_id) for batch_id in batches))

        async def still_running() -> list[str]:
            descs = await asyncio.gather(
                *(temporal.get_workflow_handle(batch_id).describe() for batch_id in batches)
            )
            return [
                batch_id
                for batch_id, desc in zip(batches, descs, strict=True)
                if desc.status == WorkflowExecutionStatus.RUNNING
            ]

        try:
            await poll_until(
                still_running,
                lambda left: not left,
                timeout=within,
                what=f"the cancelled batches of stack {self.suffix} to end",
                interval=0.25,
            )
        except PollTimeout as err:
            log.warning("terminating batches that did not end: %s", err)
            for batch_id in await still_running():
                with contextlib.suppress(RPCError):
                    await temporal.get_workflow_handle(batch_id).terminate("test stack stopped")


def toml_tables(name: str, table: dict[str, Any]) -> list[str]:
    """`table` as the TOML table `[name]`, its dict values as sub-tables (scalars as JSON, which
    TOML reads the same for numbers, strings and booleans)."""
    lines = [f"[{name}]"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in table.items() if not isinstance(v, dict)]
    for k, v in table.items():
        if isinstance(v, dict):
            lines += toml_tables(f"{name}.{k}", v)
    return lines


class SharedStacks:
    """The session's shared stacks: one started `Stack` per distinct set of options, leased
    test by test (`lease`); a stack whose tenants are all leased, whose processes exited or
    whose last lease did not end cleanly is replaced by a new one."""

    TENANTS = 64

    def __init__(self, tmp: Path, temporal_address: str) -> None:
        self.tmp = tmp
        self.temporal_address = temporal_address
        self.stacks: dict[str, Stack] = {}
        self.retired: list[Stack] = []

    async def stack(self, workers: int = 1, **options: Any) -> Stack:
        """The started shared stack of these options, with a tenant left to lease."""
        key = repr((workers, sorted(options.items())))
        s = self.stacks.get(key)
        spent = s is not None and s.leased >= len(s.tenants)
        if s is not None and (spent or not all(c.running for c in [s.api, *s.workers])):
            self.retired.append(self.stacks.pop(key))
            await s.stop()
            s = None
        if s is None:
            tmp = self.tmp / f"shared{len(self.stacks) + len(self.retired)}"
            tmp.mkdir()
            s = Stack(tmp, self.temporal_address, tenants=self.TENANTS, **options)
            try:
                await s.start(workers)
            except BaseException:
                await s.stop()
                raise
            self.stacks[key] = s
        return s

    @contextlib.asynccontextmanager
    async def lease(self, workers: int = 1, **options: Any) -> AsyncIterator[Stack]:
        """A lease of the shared stack of these options for the body of the `with`."""
        shared = await self.stack(workers, **options)
        leased = shared.lease()
        try:
            yield leased
        finally:
            try:
                await leased.stop()
            except BaseException:
                # Not back to a clean state: no later lease gets this stack.
                shared.leased = len(shared.tenants)
                raise

    async def stop(self) -> None:
        stacks, self.stacks = list(self.stacks.values()), {}
        for s in stacks:
            await s.stop()


async def submit(stack: Stack, n: int, *, key: str = API_KEY, prefix: str = "req") -> str:
    """Upload an n-line chat file and create a 24h batch; returns the batch id."""
    client = stack.client(key)
    f = await client.files.create(file=("in.jsonl", jsonl(n, prefix=prefix)), purpose="batch")
    batch = await client.batches.create(
        input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    return batch.id


async def output_ids(
    client: openai.AsyncOpenAI, batch: Any
) -> tuple[list[str], list[dict[str, Any]]]:
    """custom_ids of the output file, and the error file's records."""
    ids: list[str] = []
    errors: list[dict[str, Any]] = []
    if batch.output_file_id:
        text = (await client.files.content(batch.output_file_id)).text
        ids = [json.loads(line)["custom_id"] for line in text.splitlines()]
    if batch.error_file_id:
        text = (await client.files.content(batch.error_file_id)).text
        errors = [json.loads(line) for line in text.splitlines()]
    return ids, errors


ENDPOINT_BODIES: dict[str, Callable[[int], dict[str, Any]]] = {
    "/v1/chat/completions": lambda i: {"messages": [{"role": "user", "content": f"hello {i}"}]},
    "/v1/completions": lambda i: {"prompt": f"hello {i}", "max_tokens": 8},
    "/v1/embeddings": lambda i: {"input": f"hello {i}"},
}


def jsonl(
    n: int,
    *,
    prefix: str = "req",
    model: str = "demo",
    endpoint: str = "/v1/chat/completions",
    **body: Any,
) -> bytes:
    """An n-line batch input file for `endpoint`, custom_ids `<prefix>-<i>`."""
    out = []
    for i in range(n):
        line = {
            "custom_id": f"{prefix}-{i}",
            "method": "POST",
            "url": endpoint,
            "body": {"model": model, **ENDPOINT_BODIES[endpoint](i), **body},
        }
        out.append(json.dumps(line))
    return ("\n".join(out) + "\n").encode()


TERMINAL = ("completed", "failed", "expired", "cancelled")


async def wait_terminal(client: openai.AsyncOpenAI, batch_id: str, within: float = 300) -> Any:
    """The batch once it reached a terminal status (API errors fail the wait at once)."""
    return await poll_until(
        lambda: client.batches.retrieve(batch_id),
        lambda b: b.status in TERMINAL,
        timeout=within,
        what=f"batch {batch_id} to reach a terminal status",
        interval=0.25,
    )


async def watch_until_terminal(
    client: openai.AsyncOpenAI,
    batch_id: str,
    on_sample: Callable[[Any], None],
    within: float = 300,
    interval: float = 0.1,
) -> Any:
    """Like wait_terminal, calling `on_sample(batch)` with every batch read on the way."""

    async def sample() -> Any:
        b = await client.batches.retrieve(batch_id)
        on_sample(b)
        return b

    return await poll_until(
        sample,
        lambda b: b.status in TERMINAL,
        timeout=within,
        what=f"batch {batch_id} to reach a terminal status",
        interval=interval,
    )


async def wait_in_flight(stack: Stack, at_least: int, within: float = 120) -> None:
    """Until the stack's simulator has at least this many batch requests open at once."""
    await poll_until(
        lambda: stack.sim.app.stats_dict()["batch"]["concurrent"],
        lambda c: c >= at_least,
        timeout=within,
        what=f"{at_least} batch requests in flight at the upstream",
        interval=0.05,
    )


async def route_metric(stack: Stack, name: str) -> float | None:
    """The sample `name` of the stack's route on the api's `/metrics` (None: not there)."""
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"{stack.api_url}/metrics", headers=auth("sk-test-auditor"))).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == {"route": stack.route_id}:
                return sample.value
    return None


async def live_in_flight(stack: Stack) -> float:
    """The api's `gateway_live_in_flight` of the stack's route: its live count there."""
    value = await route_metric(stack, "gateway_live_in_flight")
    if value is None:
        raise AssertionError(f"no gateway_live_in_flight for {stack.route_id}")
    return value


def input_ids(prefix: str, n: int) -> list[str]:
    """The custom_ids of `jsonl(n, prefix=prefix)`, in input order."""
    return [f"{prefix}-{i}" for i in range(n)]


def assert_input_order(ids: list[str], expected: list[str]) -> None:
    """`ids` (an output or error file's custom_ids) are distinct lines of the input, in input
    order, as docs/batches.md promises for both files."""
    position = {cid: i for i, cid in enumerate(expected)}
    assert len(set(ids)) == len(ids), "a line written twice"
    assert set(ids) <= position.keys(), set(ids) - position.keys()
    assert [position[c] for c in ids] == sorted(position[c] for c in ids), "not in input order"


def auth(key: str = API_KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def assert_error(
    resp: httpx.Response,
    status: int,
    *,
    param: str | None = None,
    code: str | None = None,
    type_: str = "invalid_request_error",
) -> dict[str, Any]:
    """The response is OpenAI's error envelope with exactly these status, param and code."""
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"], err
    assert err["type"] == type_, err
    assert err["param"] == param, err
    assert err["code"] == code, err
    return err  # type: ignore[no-any-return]
