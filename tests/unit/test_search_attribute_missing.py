"""A namespace without one of backfill's search attributes: a create that needs it answers a 503
naming the attribute and the command that registers it, not a 500 (the real dev server's own
message is checked in tests/e2e/test_doctor.py)."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.testclient import TestClient
from temporalio.service import RPCError, RPCStatusCode

from api import errors

DEV_SERVER = "Namespace default has no mapping defined for search attribute BackfillRetryOf"


def app_raising(err: Exception) -> TestClient:
    app = FastAPI()
    errors.install(app)

    @app.post("/v1/batches")
    async def create() -> None:
        raise err

    return TestClient(app, raise_server_exceptions=False)


def test_an_unregistered_attribute_is_a_503_that_names_the_fix() -> None:
    resp = app_raising(RPCError(DEV_SERVER, RPCStatusCode.INVALID_ARGUMENT, b"")).post(
        "/v1/batches"
    )
    assert resp.status_code == 503
    error = resp.json()["error"]
    assert error["code"] == "search_attribute_missing"
    assert error["type"] == "server_error"
    command = "temporal operator search-attribute create --name BackfillRetryOf --type Keyword"
    assert command in error["message"]


def test_the_name_is_read_from_either_servers_wording() -> None:
    def name(message: str, status: RPCStatusCode = RPCStatusCode.INVALID_ARGUMENT) -> str | None:
        return errors.unregistered_search_attribute(RPCError(message, status, b""))

    assert name(DEV_SERVER) == "BackfillRetryOf"
    assert name("search attribute BackfillCreatedAt is not defined") == "BackfillCreatedAt"
    assert name("invalid query: unknown column") is None
    assert name(DEV_SERVER, RPCStatusCode.INTERNAL) is None


def test_any_other_invalid_argument_is_still_a_500() -> None:
    resp = app_raising(RPCError("bad request", RPCStatusCode.INVALID_ARGUMENT, b"")).post(
        "/v1/batches"
    )
    assert resp.status_code == 500
    assert resp.json()["error"]["type"] == "server_error"
