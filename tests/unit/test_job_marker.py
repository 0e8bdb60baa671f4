"""The job marker cannot be set by a user, and reading a job never loads its answer (issue 47):
a plain batch whose metadata said `backfill_job` read as a job, and each job read loaded the
batch's whole output file, so a few reads of a large batch took the api's memory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, BinaryIO

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.jobs import jobs_api as jobs
from backfill.batches.batch import Batch, RequestCounts
from backfill.batches.jobs import JOB_CUSTOM_ID, JOB_METADATA, RECORD_HEAD_BYTES
from backfill.batches.records import response_record_bytes
from backfill.files import Store, open_store
from backfill.platform.config import ApiKeyConfig, Settings, hash_key

CHAT = "/v1/chat/completions"
LINE = {"custom_id": "a", "method": "POST", "url": CHAT, "body": {"model": "demo", "messages": []}}


def _settings(tmp_path: Path) -> Settings:
    return Settings.model_validate(
        {
            "data_dir": str(tmp_path),
            "models": [
                {"id": "demo", "routes": [{"id": "r", "base_url": "http://127.0.0.1:1/v1"}]}
            ],
            "api_keys": [ApiKeyConfig(sha256=hash_key("sk-m"), workspace="w", name="w")],
        }
    )


@pytest.mark.parametrize("path", ["/v1/batches", "/gateway/v1/batches"])
def test_the_job_marker_is_refused_on_every_create_path(tmp_path: Path, path: str) -> None:
    """Refused with a 400 naming `metadata` before anything starts (the app has no Temporal
    client here: a create that went on would fail otherwise)."""
    settings = _settings(tmp_path)
    upload = open_store(settings).begin_upload(1 << 20)
    upload.write(json.dumps(LINE).encode() + b"\n")
    file = upload.finish(workspace="w", filename="in.jsonl", purpose="batch")
    app = create_app(settings, client=object())  # type: ignore[arg-type]
    with TestClient(app, headers={"Authorization": "Bearer sk-m"}) as http:
        metadata = {"team": "a", **JOB_METADATA}
        body: dict[str, Any] = {
            "/v1/batches": {
                "input_file_id": file.id,
                "endpoint": CHAT,
                "completion_window": "24h",
                "metadata": metadata,
            },
            "/gateway/v1/batches": {"path": CHAT, "body": LINE["body"], "metadata": metadata},
        }[path]
        r = http.post(path, json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["type"], err["param"]) == ("invalid_request_error", "metadata")
    assert "backfill_job" in err["message"]


class _CountingStore:
    """A store whose reads are counted; `read_file` and `get_result` (whole reads) refuse."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.read = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def read_file(self, file_id: str) -> bytes:
        raise AssertionError("a job read loaded a whole file")

    def get_result(self, batch_id: str, line_no: int) -> bytes | None:
        raise AssertionError("a job read loaded a whole record")

    def open_file(self, file_id: str) -> BinaryIO:
        f = self.store.open_file(file_id)
        counter = self

        class Counted:
            def __enter__(self) -> Counted:
                return self

            def __exit__(self, *exc: object) -> None:
                f.close()

            def close(self) -> None:
                f.close()

            def read(self, n: int = -1) -> bytes:
                data = f.read(n)
                counter.read += len(data)
                return data

        return Counted()  # type: ignore[return-value]

    def read_file_head(self, file_id: str, max_bytes: int) -> bytes:
        return type(self.store).read_file_head(self, file_id, max_bytes)  # type: ignore[arg-type]


def _big_record(status: int = 200) -> bytes:
    """An answer record of about 20 MB (the line's answer)."""
    body = json.dumps({"id": "x", "choices": [{"text": "y" * (20 << 20)}], "usage": {}})
    return response_record_bytes(JOB_CUSTOM_ID, status, "req_big", body)


def _job_batch(status: str, output_file_id: str | None = None, failed: int = 0) -> Batch:
    return Batch(
        id="batch_big",
        endpoint=CHAT,
        input_file_id="file-x",
        completion_window="24h",
        status=status,  # type: ignore[arg-type]
        created_at=1,
        request_counts=RequestCounts(total=1, completed=1 - failed, failed=failed),
        metadata={**JOB_METADATA},
        output_file_id=output_file_id,
    )


async def test_a_job_read_reads_a_bounded_head_of_its_output_file(tmp_path: Path) -> None:
    store = open_store(Settings(data_dir=tmp_path))
    upload = store.begin_upload(64 << 20)
    upload.write(_big_record(404) + b"\n")
    out = upload.finish(workspace="w", filename="out.jsonl", purpose="batch_output")
    counting = _CountingStore(store)
    job = await jobs.view(counting, _job_batch("completed", out.id, failed=1))  # type: ignore[arg-type]
    assert counting.read <= RECORD_HEAD_BYTES + 1
    assert (job.state, job.status_code, job.request_id) == ("failed", 404, "req_big")
    assert job.error is not None and job.error.code == "http_404"


async def test_a_running_job_read_reads_a_bounded_head_of_its_record(tmp_path: Path) -> None:
    store = open_store(Settings(data_dir=tmp_path))
    store.commit_result("batch_big", 0, _big_record())
    counting = _CountingStore(store)
    job = await jobs.view(counting, _job_batch("in_progress"))  # type: ignore[arg-type]
    assert (job.state, job.status_code, job.request_id) == ("running", 200, "req_big")
    assert len(store.get_result_head("batch_big", 0, 100) or b"") == 100


async def test_a_job_output_is_held_against_the_process_buffers_until_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claimed (3 times the record) before it is read, in the job's workspace's share: 503
    `gateway_busy` when that does not fit; given back once the answer is sent."""
    from api.deps import Identity
    from api.errors import RetryLater
    from backfill.tenancy.byte_budget import ByteBudget

    store = open_store(Settings(data_dir=tmp_path))
    record = response_record_bytes(JOB_CUSTOM_ID, 200, "req_1", json.dumps({"id": "x"}))
    upload = store.begin_upload(1 << 20)
    upload.write(record + b"\n")
    out = upload.finish(workspace="w", filename="out.jsonl", purpose="batch_output")
    batch = _job_batch("completed", out.id)
    batch.backfill.workspace = "w"

    async def job_batch(client: Any, identity: Identity, job_id: str) -> Batch:
        return batch

    monkeypatch.setattr(jobs, "job_batch", job_batch)
    settings = Settings(data_dir=tmp_path)
    member = Identity(workspace="w", role="member", key_name="w")
    full = ByteBudget(total=1 << 20, share=2 * len(record))  # less than 3 copies of the record
    with pytest.raises(RetryLater) as err:
        await jobs.output("batch_big", None, store, member, settings, full)  # type: ignore[arg-type]
    assert (err.value.status, err.value.code) == (503, "gateway_busy") and full.held == 0

    room = ByteBudget(total=1 << 20, share=1 << 20)
    answer = await jobs.output("batch_big", None, store, member, settings, room)  # type: ignore[arg-type]
    assert room.held_by("w") == 3 * (len(record) + 1)  # held while it is not sent yet
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await answer({"type": "http"}, None, send)  # type: ignore[arg-type]
    assert json.loads(sent[-1]["body"]) == {"id": "x"} and room.held == 0
