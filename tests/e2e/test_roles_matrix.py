"""Every endpoint, called with each role's key and with a foreign workspace's key, answers the
status in the table below (who owns what: workspace `alpha` owns every object here).

Rows run in table order and, within a row, in the order of its keys, so a row's successful
change comes after every refused one (a refused call must not have changed anything: the
successful one after it would then answer 409 or 404, failing the row). Batches are held in
`in_progress` by a route time window that is closed for hours, so their status is fixed while
the table runs."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from botocore.exceptions import ClientError

from tests.e2e.stack import Stack, auth, jsonl
from tests.polling import poll_until

OWNER, FOREIGN, ADMIN, AUDITOR = "sk-test-alpha", "sk-test-beta", "sk-test-admin", "sk-test-auditor"
NOBODY = "sk-test-nobody"
ROLE = {OWNER: "owner", FOREIGN: "foreign", ADMIN: "admin", AUDITOR: "auditor", NOBODY: "nobody"}


@dataclass
class Row:
    method: str
    path: str
    """With `{file}`, `{file_owner_del}`, `{file_admin_del}`, `{batch}`, `{batch2}`,
    `{route}`, `{alpha}` filled in from the objects made for the test."""
    expect: dict[str, int]
    """Key -> status, called in this order."""
    body: dict[str, Any] | None = None
    upload: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def closed_window() -> dict[str, Any]:
    """A one-minute window six hours from now (UTC): closed for the whole test."""
    start = dt.datetime.now(dt.UTC) + dt.timedelta(hours=6)
    end = start + dt.timedelta(minutes=1)
    days = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
    return {"time_zone": "UTC", "days": days, "from": f"{start:%H:%M}", "until": f"{end:%H:%M}"}


ALL_OK = {OWNER: 200, FOREIGN: 200, ADMIN: 200, AUDITOR: 200, NOBODY: 401}
ADMIN_READ = {OWNER: 403, FOREIGN: 403, AUDITOR: 200, ADMIN: 200, NOBODY: 401}
ADMIN_WRITE = {OWNER: 403, FOREIGN: 403, AUDITOR: 403, NOBODY: 401, ADMIN: 200}
OWN_READ = {FOREIGN: 404, OWNER: 200, ADMIN: 200, AUDITOR: 200, NOBODY: 401}
SCHEDULING = "/api/v1/platform/deployments/{route}/batch-scheduling"

TABLE: list[Row] = [
    # Files
    Row("GET", "/v1/files", ALL_OK),
    Row("POST", "/v1/files", {AUDITOR: 403, NOBODY: 401, OWNER: 200, FOREIGN: 200}, upload=True),
    Row("GET", "/v1/files/{file}", OWN_READ),
    Row(
        "GET",
        "/v1/files/{file}/content",
        {FOREIGN: 404, AUDITOR: 403, NOBODY: 401, OWNER: 200, ADMIN: 200},
    ),
    Row(
        "DELETE",
        "/v1/files/{file_owner_del}",
        {FOREIGN: 404, AUDITOR: 403, NOBODY: 401, OWNER: 200},
    ),
    Row("DELETE", "/v1/files/{file_admin_del}", {FOREIGN: 404, AUDITOR: 403, ADMIN: 200}),
    # Batches: another workspace's file is 404 as input_file_id (for an admin too: a batch
    # belongs to the caller's workspace).
    Row(
        "POST",
        "/v1/batches",
        {FOREIGN: 404, ADMIN: 404, AUDITOR: 403, NOBODY: 401},
        body={
            "input_file_id": "{file}",
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        },
    ),
    Row("GET", "/v1/batches", ALL_OK),
    Row("GET", "/v1/batches/{batch}", OWN_READ),
    Row("POST", "/v1/batches/{batch}/pause", {FOREIGN: 404, AUDITOR: 403, NOBODY: 401, OWNER: 200}),
    Row(
        "POST", "/v1/batches/{batch}/resume", {FOREIGN: 404, AUDITOR: 403, NOBODY: 401, OWNER: 200}
    ),
    Row("POST", "/v1/batches/{batch}/pause", {ADMIN: 200}),
    Row("POST", "/v1/batches/{batch}/resume", {ADMIN: 200}),
    Row("POST", "/v1/batches/{batch2}/cancel", {FOREIGN: 404, AUDITOR: 403, NOBODY: 401}),
    # Live proxy and models: an auditor sends no inference.
    Row("GET", "/v1/models", ALL_OK),
    Row(
        "POST",
        "/v1/chat/completions",
        {OWNER: 200, FOREIGN: 200, ADMIN: 200, AUDITOR: 403, NOBODY: 401},
        body={"model": "demo", "messages": [{"role": "user", "content": "hi"}]},
    ),
    # Management API
    Row("GET", SCHEDULING, ADMIN_READ),
    Row(
        "PUT", SCHEDULING, ADMIN_WRITE, body={"max_concurrent_lines": 4, "time_window": "{window}"}
    ),
    # Admin API
    Row("GET", "/api/v1/admin/batches", ADMIN_READ),
    Row("GET", "/api/v1/admin/batches?workspace={alpha}", ADMIN_READ),
    Row("GET", "/api/v1/admin/batches/{batch}", ADMIN_READ),
    Row("POST", "/api/v1/admin/batches/{batch}/pause", ADMIN_WRITE),
    Row("POST", "/api/v1/admin/batches/{batch}/resume", ADMIN_WRITE),
    Row("GET", "/api/v1/admin/files?workspace={alpha}", ADMIN_READ),
    Row("GET", "/api/v1/admin/usage?workspace={alpha}", ADMIN_READ),
    # Last: the owner cancels its own batch, after every refused cancel.
    Row(
        "POST", "/v1/batches/{batch}/cancel", {FOREIGN: 404, AUDITOR: 403, NOBODY: 401, OWNER: 200}
    ),
    Row("POST", "/api/v1/admin/batches/{batch2}/cancel", ADMIN_WRITE),
]


def fill(value: Any, names: dict[str, Any]) -> Any:
    if isinstance(value, str):
        if value.startswith("{") and value.endswith("}") and value[1:-1] in names:
            return names[value[1:-1]]
        return value.format(**names)
    if isinstance(value, dict):
        return {k: fill(v, names) for k, v in value.items()}
    return value


async def test_every_endpoint_with_every_role(stack: Stack, dev_server: Any) -> None:
    base = stack.api_url
    window = closed_window()
    async with httpx.AsyncClient(base_url=base, timeout=60) as http:
        # Hold every batch line: the route's window is closed for hours.
        r = await http.put(
            SCHEDULING.format(route=stack.route_id),
            headers=auth(ADMIN),
            json={"max_concurrent_lines": 4, "time_window": window},
        )
        assert r.status_code == 200, r.text

        async def upload(key: str, name: str) -> str:
            r = await http.post(
                "/v1/files",
                headers=auth(key),
                data={"purpose": "batch"},
                files={"file": (name, jsonl(2, prefix=name))},
            )
            assert r.status_code == 200, r.text
            return str(r.json()["id"])

        async def create(file_id: str) -> str:
            r = await http.post(
                "/v1/batches",
                headers=auth(OWNER),
                json={
                    "input_file_id": file_id,
                    "endpoint": "/v1/chat/completions",
                    "completion_window": "24h",
                },
            )
            assert r.status_code == 200, r.text
            return str(r.json()["id"])

        file_id = await upload(OWNER, "main")
        names: dict[str, Any] = {
            "file": file_id,
            "file_owner_del": await upload(OWNER, "del1"),
            "file_admin_del": await upload(OWNER, "del2"),
            "batch": await create(file_id),
            "batch2": await create(file_id),
            "route": stack.route_id,
            "alpha": stack.workspaces["alpha"],
            "window": window,
        }
        for batch in (names["batch"], names["batch2"]):
            await poll_until(
                lambda b=batch: http.get(f"/v1/batches/{b}", headers=auth(OWNER)),
                lambda r: r.json()["status"] == "in_progress",
                timeout=60,
                what="the batch validated and held by the closed window",
            )

        failures = []
        for row in TABLE:
            path = fill(row.path, names)
            for key, want in row.expect.items():
                kwargs: dict[str, Any] = {"headers": auth(key)}
                if row.upload:
                    kwargs["data"] = {"purpose": "batch"}
                    kwargs["files"] = {"file": ("x.jsonl", jsonl(1))}
                elif row.body is not None:
                    kwargs["json"] = fill(row.body, names)
                r = await http.request(row.method, path, **kwargs)
                if r.status_code != want:
                    failures.append(
                        f"{row.method} {row.path} as {ROLE[key]}: {r.status_code} "
                        f"(want {want}) {r.text[:200]}"
                    )
                    continue
                if want >= 400:
                    body = r.json()
                    assert set(body) == {"error"} and set(body["error"]) == {
                        "message",
                        "type",
                        "param",
                        "code",
                    }, body
        assert not failures, "\n".join(failures)

        # Listings are scoped: the foreign member sees none of alpha's files or batches.
        files = (await http.get("/v1/files", headers=auth(FOREIGN))).json()["data"]
        assert file_id not in {f["id"] for f in files}
        listed = (await http.get("/v1/batches", headers=auth(FOREIGN))).json()["data"]
        assert not {names["batch"], names["batch2"]} & {b["id"] for b in listed}
        # The admin listing, filtered by workspace, holds exactly alpha's two batches.
        r = await http.get(
            "/api/v1/admin/batches",
            headers=auth(AUDITOR),
            params={"workspace": stack.workspaces["alpha"]},
        )
        assert {b["id"] for b in r.json()["data"]} == {names["batch"], names["batch2"]}
        r = await http.get(
            "/api/v1/admin/files",
            headers=auth(AUDITOR),
            params={"workspace": stack.workspaces["alpha"]},
        )
        assert file_id in {f["id"] for f in r.json()["data"]}

    # The admin's read of alpha's file content is an audit event naming who, what and whose;
    # no key appears in the api's log.
    log = (stack.tmp / "api.log").read_text()
    events = [line for line in log.splitlines() if "audit:" in line]
    assert any(
        "key_name=ops-key" in e
        and "action=file.content" in e
        and file_id in e
        and stack.workspaces["alpha"] in e
        for e in events
    ), events
    # No key anywhere: not in the stack's logs and data directory, nor in the dev server's
    # SQLite files and log (each batch's identity snapshot holds the key id, never the key).
    places = [stack.tmp, Path(dev_server.server.data_dir)]
    files = [p for place in places for p in place.rglob("*") if p.is_file()]
    assert any(p.suffix == ".db" for p in files) and any(p.name == "api.log" for p in files)
    for path in files:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            continue  # a finished batch's work files, dropped since the listing
        for key in ROLE:
            assert key.encode() not in data, (key, path)
    # Nor in the store's objects, when the store is a bucket rather than that directory.
    if stack.store_kind == "s3":
        store = stack.store()
        stored = store.keys("")
        assert any(name.startswith("files/") for name in stored), stored
        for name in stored:
            try:
                data = stack.s3_object(name)
            except ClientError as err:
                if err.response.get("Error", {}).get("Code") != "NoSuchKey":
                    raise
                continue  # a finished batch's work objects, dropped since the listing
            for key in ROLE:
                assert key.encode() not in data, (key, name)
