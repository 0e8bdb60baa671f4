"""The finalizing activity: assemble a batch's output (2xx) and error files from its per-line
records, in input order. File ids derive from the batch id, so a rerun rewrites the same files.

Its counts and usage are the batch's final `request_counts` and `usage`: the committed records
are the one source of truth (one record per line, first writer wins), so a line committed by a
worker that died, or cancelled with the workflow, counts as what it committed, once. The batch
workflow's running tallies only show progress until then, and are replaced by these
(`BatchWorkflow._finish`, `backfill.batches.lifecycle.tally_line`)."""

from __future__ import annotations

import hashlib

from temporalio import activity

from activities.heartbeat import heartbeating
from activities.store_waits import through_outages
from backfill.batches.records import (
    END_MESSAGES,
    custom_id_of,
    error_record_bytes,
    one_line,
    outcome_from_record,
)
from backfill.files import Store, Upload
from backfill.platform.messages import RECORD_STRIDE, FinalizedFiles, FinalizeInput, FinalizeOutput

_OUTPUT_FIELDS = set(FinalizeOutput.model_fields)
"""The activity's result is `FinalizeOutput` (in the workflow's history); the offsets stay in
the store's record only."""


class FinalizeActivities:
    def __init__(self, store: Store) -> None:
        self.store = store

    @activity.defn
    async def finalize_batch(self, input: FinalizeInput) -> FinalizeOutput:
        async with heartbeating():
            return await through_outages(
                "finalizing", input.batch_id, lambda: self._finalize(input)
            )

    def _finalize(self, input: FinalizeInput) -> FinalizeOutput:
        """Assemble once; a rerun (the activity retried after a crash) answers what the first
        run published. Then drop what only a running batch needed: its pinned input, line
        index and per-line results (retention)."""
        done = self.store.read_finalized(input.batch_id)
        if done is None:
            files = self._assemble(input)
            self.store.write_finalized(input.batch_id, files.model_dump_json().encode())
            out = FinalizeOutput.model_validate(files.model_dump(include=_OUTPUT_FIELDS))
        else:
            out = FinalizeOutput.model_validate_json(done)
        self.store.drop_batch_work(input.batch_id)
        return out

    def _assemble(self, input: FinalizeInput) -> FinalizedFiles:
        """Lines that never ran get `batch_expired` / `batch_cancelled` records. Counts and
        usage are summed here, from the records, as the files are written, and so is where
        every `RECORD_STRIDE`-th record of each file starts."""
        end_code = {"expired": "batch_expired", "cancelled": "batch_cancelled"}.get(input.reason)
        out = FinalizedFiles(stride=RECORD_STRIDE, output_offsets=[], error_offsets=[])
        assert out.output_offsets is not None and out.error_offsets is not None
        usage = out.usage
        ok_up = self.store.begin_upload(max_bytes=1 << 62)
        err_up = self.store.begin_upload(max_bytes=1 << 62)
        fill_code = end_code or "internal_error"
        fill_msg = END_MESSAGES.get(fill_code, "The request has no recorded result.")

        def never_ran(line_no: int, raw: bytes) -> bytes:
            # Committed like any line's result: a rerun writes the same bytes.
            return error_record_bytes(custom_id_of(raw, line_no), fill_code, fill_msg)

        try:
            settled = self.store.settle_results(input.batch_id, input.input_file_id, never_ran)
            for line_no, raw, data in settled:
                out.total += 1
                outcome = outcome_from_record(line_no, data)
                if outcome.error_code == "invalid_record":  # unreadable on disk: say so, validly
                    msg = "The request's recorded result could not be read."
                    data = error_record_bytes(
                        custom_id_of(raw, line_no),
                        "internal_error",
                        msg,
                        _stable_id(input.batch_id, line_no),
                    )
                if outcome.usage is not None:
                    usage.add(outcome.usage)
                data = one_line(data)  # also a record committed before records were escaped
                if outcome.ok:
                    if out.completed % out.stride == 0:
                        out.output_offsets.append(ok_up.size)
                    out.completed += 1
                    ok_up.write(data + b"\n")
                else:
                    if out.failed % out.stride == 0:
                        out.error_offsets.append(err_up.size)
                    out.failed += 1
                    err_up.write(data + b"\n")
            out.output_file_id = self._publish(ok_up, input, "output")
            out.error_file_id = self._publish(err_up, input, "error")
        finally:
            ok_up.abort()
            err_up.abort()
        return out

    def _publish(self, up: Upload, input: FinalizeInput, kind: str) -> str | None:
        if up.size == 0:
            return None
        file_id = "file-" + hashlib.sha256(f"{input.batch_id}:{kind}".encode()).hexdigest()[:24]
        return up.finish(
            file_id=file_id,
            workspace=input.workspace,
            filename=f"{input.batch_id}_{kind}.jsonl",
            purpose="batch_output",
            expires_after=input.output_expires_after_seconds,
        ).id


def _stable_id(batch_id: str, line_no: int) -> str:
    """A record id that a rerun of finalizing derives again (it writes the same bytes)."""
    return "batch_req_" + hashlib.sha256(f"{batch_id}:{line_no}".encode()).hexdigest()[:24]
