"""Route settings as code on the real stack (decision 0039): a route's `settings` table in the
config file reaches its scheduler when the worker starts, the route status reads it back with
each setting's source; a PUT wins while the file is unchanged (a worker restarted with the same
file keeps it); a changed file wins at the next worker start. A bad table stops the worker and
the api at start with one line naming the route and the field, never a traceback."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path
from typing import Any

import httpx
from temporalio.client import Client

from backfill.platform.ids import scheduler_workflow_id
from backfill.platform.refs import RouteSchedulerWorkflow
from tests.e2e.conftest import MakeStack
from tests.e2e.stack import Stack, toml_tables
from tests.polling import poll_until
from tools.dev.devserver import connect_client
from tools.dev.procs import backfill_argv

ADMIN = "sk-test-admin"
SEATS = {"seats": 8, "keep_free": 2}


async def configure_signals_handled(temporal: Client, route_id: str) -> int:
    """`configure` signals in the scheduler's history that a workflow task completed after."""
    handle = temporal.get_workflow_handle_for(
        RouteSchedulerWorkflow.run, scheduler_workflow_id(route_id)
    )
    events = (await handle.fetch_history()).events
    last_completed = max(
        (i for i, e in enumerate(events) if e.HasField("workflow_task_completed_event_attributes")),
        default=-1,
    )
    return sum(
        1
        for i, e in enumerate(events[: last_completed + 1])
        if e.HasField("workflow_execution_signaled_event_attributes")
        and e.workflow_execution_signaled_event_attributes.signal_name == "configure"
    )


async def restart_worker(stack: Stack, temporal: Client, handled_before: int) -> None:
    """A new worker (reading the config file as it is now), then the old one stopped, as a
    rolling restart does; returns once the scheduler has handled the new worker's `configure`."""
    old = stack.workers[0]
    stack.start_worker()
    await poll_until(
        lambda: configure_signals_handled(temporal, stack.route_id),
        lambda n: n > handled_before,
        timeout=60,
        what="the new worker's configure signal handled",
        interval=0.2,
    )
    await asyncio.to_thread(old.stop)
    stack.workers.remove(old)


async def test_settings_from_the_file_read_back_with_their_source(make_stack: MakeStack) -> None:
    stack = await make_stack(route_settings={"priority_hint": 100, "seat_aware": SEATS})
    temporal = await connect_client(stack.temporal_address)
    url = f"/api/v1/platform/deployments/{stack.route_id}/batch-scheduling"
    async with httpx.AsyncClient(base_url=stack.api_url, headers=stack.auth(ADMIN)) as http:

        async def read() -> dict[str, Any]:
            r = await http.get(url)
            assert r.status_code == 200, r.text
            return r.json()  # type: ignore[no-any-return]

        # The worker started the route's scheduler with the file's table: the status is the
        # scheduler's own answer (not stale, not the config read by the api).
        await poll_until(
            lambda: configure_signals_handled(temporal, stack.route_id),
            lambda n: n >= 1,
            timeout=60,
            what="the worker's configure signal handled",
            interval=0.2,
        )
        doc = await read()
        assert doc["status"]["stale"] is False
        assert doc["settings"]["priority_hint"] == 100
        assert doc["settings"]["seat_aware"] == SEATS
        assert doc["settings"]["max_concurrent_lines"] == stack.cap
        assert doc["sources"] == {
            "max_concurrent_lines": "config",  # the route's own max_concurrent_lines
            "maintenance": "default",
            "time_window": "default",
            "yield_to_live_traffic": "default",
            "server_load": "default",
            "seat_aware": "config",
            "preempt": "default",
            "reopen_ramp": "default",
            "priority_hint": "config",
        }, doc["sources"]

        # A PUT wins while the file is unchanged: the field it changed says so.
        r = await http.put(url, json={**doc["settings"], "priority_hint": 5})
        assert r.status_code == 200, r.text
        assert r.json()["sources"]["priority_hint"] == "admin_api"
        assert r.json()["sources"]["seat_aware"] == "config"

        # A worker restarted with the same file keeps the PUT.
        await restart_worker(stack, temporal, 1)
        doc = await read()
        assert doc["settings"]["priority_hint"] == 5
        assert doc["sources"]["priority_hint"] == "admin_api"

        # A changed file wins at the next worker start; a field it no longer declares returns
        # to its default.
        stack.route_settings = {"priority_hint": 200}
        stack.write_config()
        await restart_worker(stack, temporal, 2)
        doc = await read()
        assert doc["settings"]["priority_hint"] == 200
        assert doc["settings"]["seat_aware"] is None
        assert doc["sources"]["priority_hint"] == "config"
        assert doc["sources"]["seat_aware"] == "default"


def test_a_bad_table_stops_the_processes_naming_the_route_and_field(tmp_path: Path) -> None:
    config = tmp_path / "backfill.toml"
    lines = [
        "[[models]]",
        'id = "demo"',
        "[[models.routes]]",
        'id = "gpu-a"',
        'base_url = "http://127.0.0.1:9/v1"',
        *toml_tables("models.routes.settings", {"preempt": {"max_preemptions": 0}}),
    ]
    config.write_text("\n".join(lines) + "\n")
    env = {**os.environ, "BACKFILL_CONFIG": str(config), "TEMPORAL_ADDRESS": "127.0.0.1:9"}
    for command in ("worker", "api"):
        done = subprocess.run(
            backfill_argv(command), env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 2, (command, done.returncode, done.stderr)
        assert "Traceback" not in done.stderr, done.stderr
        assert (
            "models.0.routes.0.settings.preempt.max_preemptions (route 'gpu-a' of model 'demo'): "
            "Input should be greater than or equal to 1"
        ) in done.stderr, done.stderr
