"""Retention on the real stack: inputs expire after 30 days unless the upload says otherwise
(OpenAI's `expires_after`), the Temporal Schedule's cleanup deletes expired files, and a
finished batch keeps only its output files (its pinned input and per-line results are gone),
even when a late line commits after finalizing."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import openai
import pytest

from backfill.files import BatchFinalized
from backfill.platform.messages import CleanupOutput
from tests.conftest import TemporalServer
from tests.e2e.stack import Stack, jsonl, output_ids, store_kind, wait_terminal
from worker.retention import schedule_id

pytestmark = pytest.mark.store  # also run on the S3 store by `make test` (tests/e2e/stack.py)


async def test_inputs_expire_after_30_days_or_as_the_upload_asks(shared_stack: Stack) -> None:
    client = shared_stack.client()
    f = await client.files.create(file=("a.jsonl", jsonl(1)), purpose="batch")
    assert f.expires_at == f.created_at + 30 * 86400
    g = await client.files.create(
        file=("b.jsonl", jsonl(1)),
        purpose="batch",
        expires_after={"anchor": "created_at", "seconds": 7200},
    )
    assert g.expires_at == g.created_at + 7200
    assert (await client.files.retrieve(g.id)).expires_at == g.expires_at
    for bad in (
        {"anchor": "created_at", "seconds": 10},
        {"anchor": "last_active_at", "seconds": 7200},
    ):
        with pytest.raises(openai.BadRequestError) as err:
            await client.files.create(
                file=("c.jsonl", jsonl(1)), purpose="batch", expires_after=bad
            )  # type: ignore[arg-type]
        assert err.value.body["param"].startswith("expires_after.")  # type: ignore[index]


async def test_the_schedule_deletes_expired_files_and_a_finished_batch_keeps_only_its_outputs(
    tmp_path: Path, dev_server: TemporalServer
) -> None:
    stack = Stack(
        tmp_path, dev_server.address, extra_env={"BACKFILL_CLEANUP_INTERVAL_SECONDS": "3600"}
    )
    async with stack.running():
        client = stack.client()
        f = await client.files.create(file=("in.jsonl", jsonl(5)), purpose="batch")
        batch = await client.batches.create(
            input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        done = await wait_terminal(client, batch.id, within=120)
        assert done.status == "completed"
        ids, _ = await output_ids(client, done)
        assert sorted(ids) == sorted(f"req-{i}" for i in range(5))
        store = stack.store()
        assert store.keys(f"batches/{batch.id}/") == [f"batches/{batch.id}/finalized.json"]
        # A late line (its worker lost its heartbeat) commits after finalizing: the local store
        # refuses it; on S3 the retention pass below removes it.
        try:
            store.commit_result(batch.id, 3, b'{"late": true}')
        except BatchFinalized:
            assert store_kind() == "local"

        # The input expires (made due here rather than waiting 30 days); the output does not.
        meta = store.get_file(f.id)
        assert meta is not None
        store.update_file(meta.model_copy(update={"expires_at": int(time.time()) - 1}))

        temporal = await dev_server.client()
        handle = temporal.get_schedule_handle(schedule_id(stack.task_queue))
        await handle.trigger()
        deadline = time.monotonic() + 60
        while not (await handle.describe()).info.recent_actions:
            assert time.monotonic() < deadline, "the schedule never started its pass"
            await asyncio.sleep(0.2)
        [action] = (await handle.describe()).info.recent_actions
        run = temporal.get_workflow_handle(action.action.workflow_id, result_type=CleanupOutput)
        out = await asyncio.wait_for(run.result(), 60)
        assert out.deleted_files == 1 and out.abandoned_uploads == 0
        assert out.finalized_leftovers == (1 if store_kind() == "s3" else 0)
        assert store.get_file(f.id) is None
        assert store.keys(f"batches/{batch.id}/") == [f"batches/{batch.id}/finalized.json"]
        with pytest.raises(openai.NotFoundError):
            await client.files.retrieve(f.id)
        assert done.output_file_id is not None
        assert (await client.files.retrieve(done.output_file_id)).expires_at is None
        await handle.delete()


async def test_output_expires_after_and_a_long_non_ascii_file_name(shared_stack: Stack) -> None:
    client = shared_stack.client()
    f = await client.files.create(file=("名前" * 128 + ".jsonl", jsonl(2)), purpose="batch")
    batch = await client.batches.create(
        input_file_id=f.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        extra_body={"output_expires_after": {"anchor": "created_at", "seconds": 7200}},
    )
    done = await wait_terminal(client, batch.id, within=120)
    assert done.status == "completed" and done.output_file_id is not None
    out = await client.files.retrieve(done.output_file_id)
    assert out.expires_at == out.created_at + 7200
    with pytest.raises(openai.BadRequestError) as err:
        await client.batches.create(
            input_file_id=f.id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            extra_body={"output_expires_after": {"anchor": "created_at", "seconds": 5}},
        )
    assert err.value.body["param"] == "output_expires_after"  # type: ignore[index]
