"""The api's OpenAPI document describes the real API, and the models carry OpenAI's fields.

No server: the schema comes from `app.openapi()`; the few requests go through FastAPI's in-process
TestClient (the lifespan makes the file store; Temporal is never called on these paths)."""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai.types
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from pydantic import BaseModel
from temporalio.service import RPCError, RPCStatusCode

from api.app import create_app
from api.batches import batches_api as batches
from api.errors import NOT_AN_OBJECT, NOT_JSON, invalid_request
from api.files import files_api as files
from api.routes import routes_api as admin
from backfill.batches.batch import Batch
from backfill.platform.config import ApiKeyConfig, Settings, hash_key
from backfill.routes.settings import RouteSettings

KEY = "sk-unit"
ROUTE_PREFIXES = ("/v1/", "/api/v1/")


class _NoWorkflows:
    """A Temporal client with no workflow at all: every query is NOT_FOUND (the admission
    workflow of a workspace that never created a batch)."""

    def get_workflow_handle_for(self, *args: object, **kwargs: object) -> _NoWorkflows:
        return self

    async def query(self, *args: object, **kwargs: object) -> None:
        raise RPCError("workflow not found", RPCStatusCode.NOT_FOUND, b"")


def build_app(data_dir: Path) -> FastAPI:
    settings = Settings(
        data_dir=data_dir,
        api_keys=[ApiKeyConfig(sha256=hash_key(KEY), workspace="unit", name="unit")],
    )
    return create_app(settings, client=_NoWorkflows())  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return build_app(tmp_path_factory.mktemp("schema")).openapi()


@pytest.fixture
def http(tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(build_app(tmp_path), headers={"Authorization": f"Bearer {KEY}"}) as c:
        yield c


def operations(spec: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """Every `/v1` and `/api/v1` operation of the document; at least every route of our routers
    (none is left out of the schema)."""
    ops = [
        (method.upper(), path, op)
        for path, item in spec["paths"].items()
        if path.startswith(ROUTE_PREFIXES)
        for method, op in item.items()
    ]
    served = {
        (method, route.path)
        for router in (files.router, batches.router, admin.router)
        for route in router.routes
        if isinstance(route, APIRoute)
        for method in route.methods
    }
    assert len(served) == 13 and served <= {(m, p) for m, p, _ in ops}
    return ops


def resolve(spec: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def response_schema(spec: dict[str, Any], path: str, method: str, status: str) -> dict[str, Any]:
    content = spec["paths"][path][method]["responses"][status]["content"]
    return resolve(spec, content["application/json"]["schema"])


def nested_model(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside `X`, `Optional[X]` or `List[X]`, if there is one."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, list):
        for arg in typing.get_args(annotation):
            found = nested_model(arg)
            if found is not None:
                return found
    return None


def sub_schema(spec: dict[str, Any], prop: dict[str, Any]) -> dict[str, Any] | None:
    """The object schema of a property that is `X`, `X | null` or a list of `X`."""
    prop = resolve(spec, prop)
    if prop.get("type") == "object":
        return prop
    if prop.get("type") == "array":
        return sub_schema(spec, prop["items"])
    for alt in prop.get("anyOf", ()):
        found = sub_schema(spec, alt)
        if found is not None:
            return found
    return None


def missing_fields(spec: dict[str, Any], ours: dict[str, Any], sdk: type[BaseModel]) -> list[str]:
    """SDK fields (recursively) our schema lacks, or does not always send though the SDK
    requires them."""
    missing = []
    for name, field in sdk.model_fields.items():
        if name not in ours["properties"]:
            missing.append(name)
            continue
        if field.is_required() and name not in ours.get("required", ()):
            missing.append(f"{name} (required by the SDK)")
        inner = nested_model(field.annotation)
        if inner is not None:
            sub = sub_schema(spec, ours["properties"][name])
            if sub is None:
                missing.append(f"{name} (not an object)")
            else:
                missing += [f"{name}.{m}" for m in missing_fields(spec, sub, inner)]
    return missing


# ---- our models carry every field of the openai SDK's types --------------------------------


@pytest.mark.parametrize(
    ("path", "method", "sdk"),
    [
        ("/v1/batches/{batch_id}", "get", openai.types.Batch),
        ("/v1/batches", "post", openai.types.Batch),
        ("/v1/batches/{batch_id}/cancel", "post", openai.types.Batch),
        ("/v1/files/{file_id}", "get", openai.types.FileObject),
        ("/v1/files", "post", openai.types.FileObject),
        ("/v1/files/{file_id}", "delete", openai.types.FileDeleted),
    ],
)
def test_response_schemas_carry_every_field_of_the_sdk_type(
    spec: dict[str, Any], path: str, method: str, sdk: type[BaseModel]
) -> None:
    ours = response_schema(spec, path, method, "200")
    assert missing_fields(spec, ours, sdk) == []
    # The walk above compares at least every top-level field.
    assert set(sdk.model_fields) <= set(ours["properties"])


@pytest.mark.parametrize(
    ("path", "sdk"),
    [("/v1/batches", openai.types.Batch), ("/v1/files", openai.types.FileObject)],
)
def test_list_schemas_are_openai_cursor_pages(
    spec: dict[str, Any], path: str, sdk: type[BaseModel]
) -> None:
    page = response_schema(spec, path, "get", "200")
    assert set(page["required"]) == {"object", "data", "first_id", "last_id", "has_more"}
    item = resolve(spec, page["properties"]["data"]["items"])
    assert missing_fields(spec, item, sdk) == []


def test_the_checker_notices_a_missing_field(spec: dict[str, Any]) -> None:
    """The comparison can fail: a schema without `output_file_id` or `usage.total_tokens`."""
    ours = response_schema(spec, "/v1/batches/{batch_id}", "get", "200")
    trimmed = {**ours, "properties": dict(ours["properties"])}
    del trimmed["properties"]["output_file_id"]
    assert missing_fields(spec, trimmed, openai.types.Batch) == ["output_file_id"]
    usage = sub_schema(spec, ours["properties"]["usage"])
    assert usage is not None
    broken = {**spec, "components": {"schemas": dict(spec["components"]["schemas"])}}
    broken["components"]["schemas"]["Usage"] = {
        **usage,
        "properties": {k: v for k, v in usage["properties"].items() if k != "total_tokens"},
    }
    assert missing_fields(broken, ours, openai.types.Batch) == ["usage.total_tokens"]


def test_batch_wire_output_keeps_nulls_and_parses_with_the_sdk() -> None:
    batch = Batch(
        id="batch_x",
        endpoint="/v1/chat/completions",
        input_file_id="file-x",
        completion_window="24h",
        status="validating",
        created_at=1,
    )
    wire = batch.model_dump(mode="json")
    for name in ("output_file_id", "error_file_id", "errors", "completed_at", "metadata"):
        assert name in wire and wire[name] is None
    assert openai.types.Batch.model_validate(wire).status == "validating"


# ---- every route has a 2xx schema, and errors are documented in the envelope -----------------


def test_every_v1_and_api_v1_route_has_a_2xx_response_schema(spec: dict[str, Any]) -> None:
    for method, path, op in operations(spec):
        ok = [s for s in op["responses"] if s.startswith("2")]
        assert ok, (method, path)
        for status in ok:
            content = op["responses"][status].get("content", {})
            schemas = [c.get("schema") for c in content.values()]
            assert schemas and all(schemas), (method, path, status, content)
            for schema in schemas:
                assert resolve(spec, schema), (method, path, status)


def test_errors_are_documented_in_the_envelope_never_fastapis_422(spec: dict[str, Any]) -> None:
    assert "HTTPValidationError" not in spec["components"]["schemas"]
    envelope = {"$ref": "#/components/schemas/ErrorResponse"}
    for method, path, op in operations(spec):
        errors = {s: r for s, r in op["responses"].items() if not s.startswith("2")}
        assert "422" not in errors, (method, path)
        assert {"400", "401", "500"} <= set(errors), (method, path)
        for status, resp in errors.items():
            assert resp["content"]["application/json"]["schema"] == envelope, (path, status)
    detail = resolve(spec, {"$ref": envelope["$ref"]})["properties"]["error"]
    assert set(resolve(spec, detail)["required"]) == {"message", "type", "param", "code"}


def test_create_batch_documents_its_typed_body(spec: dict[str, Any]) -> None:
    body = spec["paths"]["/v1/batches"]["post"]["requestBody"]["content"]["application/json"]
    schema = resolve(spec, body["schema"])
    assert set(schema["required"]) == {"input_file_id", "endpoint", "completion_window"}
    assert schema["properties"]["completion_window"]["enum"] == ["24h", "48h", "72h", "168h"]
    upload = spec["paths"]["/v1/files"]["post"]["requestBody"]["content"]
    assert set(upload["multipart/form-data"]["schema"]["required"]) == {"file", "purpose"}


# ---- validation errors in OpenAI's envelope -----------------------------------------------------


@pytest.mark.parametrize(
    ("error", "param", "message"),
    [
        ({"type": "json_invalid", "loc": ("body", 3), "msg": "JSON decode error"}, None, NOT_JSON),
        ({"type": "dict_type", "loc": ("body",), "msg": "x"}, None, NOT_AN_OBJECT),
        ({"type": "missing", "loc": ("body",), "msg": "x"}, None, NOT_AN_OBJECT),
        (
            {"type": "missing", "loc": ("body", "endpoint"), "msg": "Field required"},
            "endpoint",
            "Missing required parameter: 'endpoint'.",
        ),
        (
            {"type": "string_type", "loc": ("body", "metadata", "k"), "msg": "Input should be"},
            "metadata",
            "Invalid value for 'metadata.k': Input should be.",
        ),
        (
            {"type": "int_parsing", "loc": ("query", "limit"), "msg": "Input should be"},
            "limit",
            "Invalid value for 'limit': Input should be.",
        ),
    ],
)
def test_validation_errors_map_to_a_400_with_the_top_level_param(
    error: dict[str, Any], param: str | None, message: str
) -> None:
    err = invalid_request(error)
    assert (err.status, err.param, err.message, err.code) == (400, param, message, None)


@pytest.mark.parametrize(
    ("content", "param"),
    [
        (b"not json", None),
        (b"[1, 2]", None),
        (b"", None),
        (b'{"input_file_id": "file-x", "endpoint": "/v1/chat/completions"}', "completion_window"),
        (
            b'{"input_file_id": "f", "endpoint": "/v1/embeddings", "completion_window": ["24h"]}',
            "completion_window",
        ),
        (
            b'{"input_file_id": "f", "endpoint": {}, "completion_window": "24h"}',
            "endpoint",
        ),
    ],
)
def test_bad_create_bodies_are_400_in_the_envelope(
    http: TestClient, content: bytes, param: str | None
) -> None:
    resp = http.post("/v1/batches", content=content, headers={"Content-Type": "application/json"})
    assert resp.status_code == 400, resp.text
    assert resp.json() == {
        "error": {
            "message": resp.json()["error"]["message"],
            "type": "invalid_request_error",
            "param": param,
            "code": None,
        }
    }


def test_file_routes_answer_the_documented_models(http: TestClient) -> None:
    up = http.post("/v1/files", data={"purpose": "batch"}, files={"file": ("a.jsonl", b"{}\n")})
    assert up.status_code == 200, up.text
    body = up.json()
    # OpenAI's field order and its nulls, nothing internal.
    assert list(body) == [
        "id",
        "bytes",
        "created_at",
        "filename",
        "purpose",
        "object",
        "status",
        "expires_at",
        "status_details",
    ]
    assert body["expires_at"] == body["created_at"] + 30 * 86400  # inputs: 30 days by default
    assert body["status_details"] is None
    assert openai.types.FileObject.model_validate(body).bytes == 3
    assert http.get(f"/v1/files/{body['id']}").json() == body
    listed = http.get("/v1/files").json()
    assert listed == {
        "object": "list",
        "data": [body],
        "first_id": body["id"],
        "last_id": body["id"],
        "has_more": False,
    }
    assert http.get(f"/v1/files/{body['id']}/content").content == b"{}\n"
    deleted = http.delete(f"/v1/files/{body['id']}").json()
    assert deleted == {"id": body["id"], "object": "file", "deleted": True}
    assert http.get(f"/v1/files/{body['id']}").status_code == 404
    bad = http.get("/v1/files", params={"limit": "abc"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "limit"


def test_a_batch_summary_fits_temporals_400_bytes_whatever_the_file_name() -> None:
    from api.batches.batches_api import SUMMARY_BYTES, batch_summary

    for name in ("in.jsonl", "名" * 256, "é" * 300, "😀" * 256):
        summary = batch_summary("/v1/chat/completions", name, "workspace-" + "w" * 50)
        assert len(summary.encode()) <= SUMMARY_BYTES, (name[:5], len(summary.encode()))
        assert summary.startswith("/v1/chat/completions batch of ")
        assert summary.endswith(f"(workspace-{'w' * 50})")
    assert batch_summary("/v1/embeddings", "a.jsonl", "w") == "/v1/embeddings batch of a.jsonl (w)"


def test_the_web_console_is_not_in_the_schema(spec: dict[str, Any]) -> None:
    assert not [p for p in spec["paths"] if p.startswith("/console")]


def test_the_settings_schema_is_the_scheduler_s_own_model(spec: dict[str, Any]) -> None:
    path = spec["paths"]["/api/v1/platform/deployments/{route_id}/batch-scheduling"]
    body = path["put"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/RouteSettings-Input"}
    doc = response_schema(
        spec, "/api/v1/platform/deployments/{route_id}/batch-scheduling", "get", "200"
    )
    shown = resolve(spec, doc["properties"]["settings"])
    taken = resolve(spec, body)
    assert set(shown["properties"]) == set(taken["properties"]) == set(RouteSettings.model_fields)
    assert set(shown["required"]) == set(RouteSettings.model_fields)  # every field always sent
    assert taken["properties"]["max_concurrent_lines"]["maximum"] == 256
