"""The admin jobs API without a server: the state filter's coarse status query agrees with the
job state mapping, and the OpenAPI document types the six `/gateway/ui-api/batches` operations
(the e2e tests in tests/e2e/test_admin_jobs.py drive them on the real stack)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, get_args

import pytest
from fastapi.testclient import TestClient

from api.errors import InvalidRequest
from api.platform_admin.jobs import job_filters
from backfill.batches.batch import BatchStatus
from backfill.batches.jobs import BATCH_STATUSES, JobState, job_state, settled_state
from tests.unit.test_api_schema import build_app, resolve
from tests.unit.test_jobs import batch

PREFIX = "/gateway/ui-api/batches"


@pytest.mark.parametrize(
    ("status", "running", "completed", "paused"),
    list(itertools.product(get_args(BatchStatus), (0, 1), (0, 1), (False, True))),
)
def test_a_job_state_is_found_under_its_batch_statuses(
    status: str, running: int, completed: int, paused: bool
) -> None:
    b = batch(status, running=running, completed=completed, paused=paused)
    state = job_state(b)
    assert b.status in BATCH_STATUSES[state]
    settled = settled_state(b.status, completed)
    assert settled is None or settled == state


def test_every_state_has_its_statuses() -> None:
    assert set(BATCH_STATUSES) == set(get_args(JobState))


def test_filters_become_one_visibility_query() -> None:
    assert job_filters(None, None, None) == ""
    assert job_filters("ws'1", "paused", "demo") == (
        "BackfillWorkspace = 'ws\\'1' AND BackfillModels = 'demo' AND "
        "BackfillStatus IN ('validating', 'in_progress')"
    )
    assert job_filters(None, "cancelled", None) == "BackfillStatus IN ('cancelled')"
    with pytest.raises(InvalidRequest) as err:
        job_filters(None, "in_progress", None)  # a batch status, not a job state
    assert err.value.param == "state"


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return build_app(tmp_path_factory.mktemp("admin-jobs")).openapi()


def test_the_six_operations_are_typed(spec: dict[str, Any]) -> None:
    paths = spec["paths"]
    ops = {
        (method, path) for path, item in paths.items() if path.startswith(PREFIX) for method in item
    }
    assert ops == {
        ("get", PREFIX),
        ("get", PREFIX + "/{job_id}"),
        ("get", PREFIX + "/{job_id}/output"),
        ("post", PREFIX + "/{job_id}/pause"),
        ("post", PREFIX + "/{job_id}/resume"),
        ("post", PREFIX + "/{job_id}/cancel"),
    }
    listing = paths[PREFIX]["get"]
    assert {p["name"] for p in listing["parameters"]} == {
        "workspace",
        "state",
        "model",
        "after",
        "limit",
    }
    page = resolve(spec, listing["responses"]["200"]["content"]["application/json"]["schema"])
    job = resolve(spec, page["properties"]["data"]["items"])
    for path in ("/{job_id}", "/{job_id}/pause", "/{job_id}/resume", "/{job_id}/cancel"):
        method = "get" if path == "/{job_id}" else "post"
        op = paths[PREFIX + path][method]
        one = op["responses"]["200"]["content"]["application/json"]["schema"]
        assert resolve(spec, one) == job
        assert {"403", "404"} <= set(op["responses"])
    assert {"attempts", "state", "workspace", "identity", "request_id"} <= set(job["required"])
    identity = resolve(spec, job["properties"]["identity"])
    assert set(identity["properties"]) == {"workspace", "key_id", "role", "allowed_models"}
    assert "409" in paths[PREFIX + "/{job_id}/output"]["get"]["responses"]


def test_a_member_is_refused_before_temporal_is_asked(tmp_path: Path) -> None:
    app = build_app(tmp_path)  # its one key is a member's; its Temporal client has no workflow
    with TestClient(app, headers={"Authorization": "Bearer sk-unit"}) as http:
        for method, path in (("GET", ""), ("GET", "/batch_1"), ("POST", "/batch_1/cancel")):
            r = http.request(method, PREFIX + path)
            assert r.status_code == 403, r.text
            assert r.json()["error"]["code"] == "insufficient_role"
