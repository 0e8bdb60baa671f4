"""Activities of a batch: validate the input, run one line, assemble the output files.

Methods of a class that receives its clients (settings, file store, httpx client), built once in
`worker/`. Line results are committed to the store first-writer-wins, so a line whose activity ran
twice (a worker died after writing) is committed exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import secrets
from collections.abc import AsyncIterator
from typing import Any

import httpx
from temporalio import activity

from activities.validation import validate_input as validate_lines
from backfill.batches import TokenCounts
from backfill.config import RouteConfig, Settings
from backfill.store import FileStore, RouteLines
from workflows.messages import (
    FinalizeInput,
    FinalizeOutput,
    LineInput,
    LineOutcome,
    RouteAssignment,
    ValidateInput,
    ValidateOutput,
)

log = logging.getLogger(__name__)

RETRYABLE_STATUS = frozenset({429, 503})
HEARTBEAT_EVERY = 2.0
END_MESSAGES = {
    "batch_expired": "This request could not be executed before the completion window expired.",
    "batch_cancelled": "This request was not executed because the batch was cancelled.",
}


class LineActivities:
    def __init__(self, settings: Settings, store: FileStore, http: httpx.AsyncClient) -> None:
        self.settings = settings
        self.store = store
        self.http = http

    # ---- validation -----------------------------------------------------------------------------
    @activity.defn
    async def validate_input(self, input: ValidateInput) -> ValidateOutput:
        async with _heartbeating():
            return await asyncio.to_thread(self._validate, input)

    def _validate(self, input: ValidateInput) -> ValidateOutput:
        allowed = frozenset(input.allowed_models) if input.allowed_models is not None else None
        with open(self.store.batch_input_path(input.batch_id, input.input_file_id), "rb") as f:
            out = validate_lines(
                f,
                batch_id=input.batch_id,
                endpoint=input.endpoint,
                settings=self.settings,
                allowed_models=allowed,
            )
        if out.errors:
            return ValidateOutput(errors=out.errors)
        self.store.write_index(
            input.batch_id, out.offsets, out.lengths, out.routes, out.route_line_numbers
        )
        return ValidateOutput(
            total=len(out.offsets),
            routes=[_assignment(i, r) for i, r in enumerate(out.routes)],
            models=out.models,
        )

    # ---- one line -------------------------------------------------------------------------------
    @activity.defn
    async def run_line(self, input: LineInput) -> LineOutcome:
        line_no = self.store.line_number(input.batch_id, input.route_index, input.position)
        committed = self.store.get_result(input.batch_id, line_no)
        if committed is not None:  # it ran before (its worker died after writing): once only
            return outcome_from_record(line_no, committed)
        if input.give_up_code is not None:
            custom_id = self._custom_id(input, line_no)
            record = error_record(custom_id, input.give_up_code, input.give_up_message or "")
            return self._commit(input.batch_id, line_no, record)
        raw = self.store.read_line(input.batch_id, input.input_file_id, line_no)
        request = json.loads(raw)
        custom_id = request["custom_id"]
        route = self.settings.route(input.route_id)
        if route is None:
            record = error_record(
                custom_id, "route_removed", f"Route {input.route_id!r} is no longer configured."
            )
            return self._commit(input.batch_id, line_no, record)
        async with _heartbeating():
            record, retry = await self._send(route, input, request)
        if retry and not input.final_attempt:
            return LineOutcome(line=line_no, retry=True, status_code=_status_of(record))
        return self._commit(input.batch_id, line_no, record)

    def _custom_id(self, input: LineInput, line_no: int) -> str:
        try:
            raw = self.store.read_line(input.batch_id, input.input_file_id, line_no)
            return str(json.loads(raw)["custom_id"])
        except (OSError, ValueError, KeyError):
            return f"line-{line_no + 1}"

    async def _send(
        self, route: RouteConfig, input: LineInput, request: dict[str, Any]
    ) -> tuple[dict[str, Any], bool]:
        """Send one request; returns (result record, whether it is worth sending again)."""
        custom_id = request["custom_id"]
        url = route.base_url.rstrip("/") + input.endpoint.removeprefix("/v1")
        headers = {"X-Backfill-Batch": input.batch_id, "Content-Type": "application/json"}
        if route.api_key_env:
            key = os.environ.get(route.api_key_env)
            if key:
                headers["Authorization"] = f"Bearer {key}"
        limit = self.settings.limits.max_response_bytes
        try:
            # The whole exchange, not each read, is bounded by the line timeout.
            async with asyncio.timeout(self.settings.limits.line_timeout_seconds):
                async with self.http.stream(
                    "POST",
                    url,
                    content=json.dumps(request["body"]).encode(),
                    headers=headers,
                    timeout=httpx.Timeout(None, connect=10.0),
                ) as resp:
                    body = bytearray()
                    async for chunk in resp.aiter_bytes():
                        body += chunk
                        if len(body) > limit:
                            msg = f"The response was larger than the {limit}-byte cap."
                            return error_record(custom_id, "response_too_large", msg), False
                    request_id = resp.headers.get("x-request-id") or f"req_{secrets.token_hex(12)}"
                    status = resp.status_code
        except httpx.ConnectError as err:
            return error_record(custom_id, "connection_error", _describe(err)), True
        except (TimeoutError, httpx.TimeoutException) as err:
            msg = f"No complete response within {self.settings.limits.line_timeout_seconds} s."
            return error_record(custom_id, "request_timeout", msg or _describe(err)), False
        except httpx.HTTPError as err:
            return error_record(custom_id, "upstream_error", _describe(err)), False
        try:
            parsed: Any = json.loads(body)
        except ValueError:
            parsed = {"error": {"message": body[:2000].decode(errors="replace")}}
        record = {
            "id": f"batch_req_{secrets.token_hex(12)}",
            "custom_id": custom_id,
            "response": {"status_code": status, "request_id": request_id, "body": parsed},
            "error": None,
        }
        return record, status in RETRYABLE_STATUS

    def _commit(self, batch_id: str, line_no: int, record: dict[str, Any]) -> LineOutcome:
        data = json.dumps(record, separators=(",", ":")).encode()
        committed, _ = self.store.commit_result(batch_id, line_no, data)
        return outcome_from_record(line_no, committed)

    # ---- finalizing -----------------------------------------------------------------------------
    @activity.defn
    async def finalize_batch(self, input: FinalizeInput) -> FinalizeOutput:
        async with _heartbeating():
            return await asyncio.to_thread(self._finalize, input)

    def _finalize(self, input: FinalizeInput) -> FinalizeOutput:
        """Assemble output (2xx) and error files from the per-line records, in input order.

        Lines that never ran get `batch_expired` / `batch_cancelled` records. Output file ids
        derive from the batch id, so running this twice rewrites the same files."""
        end_code = {"expired": "batch_expired", "cancelled": "batch_cancelled"}.get(input.reason)
        out = FinalizeOutput()
        usage = out.usage
        ok_up = self.store.begin_upload(max_bytes=1 << 62)
        err_up = self.store.begin_upload(max_bytes=1 << 62)
        try:
            for line_no, raw in self.store.iter_lines(input.batch_id, input.input_file_id):
                out.total += 1
                data = self.store.get_result(input.batch_id, line_no)
                if data is None:
                    custom_id = json.loads(raw)["custom_id"]
                    code = end_code or "internal_error"
                    msg = END_MESSAGES.get(code, "The request has no recorded result.")
                    data = json.dumps(error_record(custom_id, code, msg)).encode()
                outcome = outcome_from_record(line_no, data)
                if outcome.usage is not None:
                    usage.add(outcome.usage)
                if outcome.ok:
                    out.completed += 1
                    ok_up.write(data + b"\n")
                else:
                    out.failed += 1
                    err_up.write(data + b"\n")
            out.output_file_id = self._publish(ok_up, input, "output")
            out.error_file_id = self._publish(err_up, input, "error")
        finally:
            ok_up.abort()
            err_up.abort()
        return out

    def _publish(self, up: Any, input: FinalizeInput, kind: str) -> str | None:
        if up.size == 0:
            return None
        file_id = "file-" + hashlib.sha256(f"{input.batch_id}:{kind}".encode()).hexdigest()[:24]
        return up.finish(
            file_id=file_id,
            workspace=input.workspace,
            filename=f"{input.batch_id}_{kind}.jsonl",
            purpose="batch_output",
        ).id


def _assignment(index: int, r: RouteLines) -> RouteAssignment:
    return RouteAssignment(index=index, route_id=r.route_id, model=r.model, total=r.count)


def error_record(custom_id: str, code: str, message: str) -> dict[str, Any]:
    return {
        "id": f"batch_req_{secrets.token_hex(12)}",
        "custom_id": custom_id,
        "response": None,
        "error": {"code": code, "message": message},
    }


def outcome_from_record(line_no: int, data: bytes) -> LineOutcome:
    """The small outcome the workflow counts, derived from the committed record."""
    record = json.loads(data)
    response = record.get("response")
    error = record.get("error")
    if response is None:
        return LineOutcome(line=line_no, error_code=(error or {}).get("code"))
    status = int(response.get("status_code", 0))
    body = response.get("body")
    usage = _usage(body.get("usage")) if isinstance(body, dict) else None
    return LineOutcome(
        line=line_no,
        ok=200 <= status < 300,
        status_code=status,
        error_code=None if 200 <= status < 300 else f"http_{status}",
        usage=usage,
    )


def _usage(u: Any) -> TokenCounts | None:
    if not isinstance(u, dict):
        return None
    prompt = int(u.get("prompt_tokens") or u.get("input_tokens") or 0)
    completion = int(u.get("completion_tokens") or u.get("output_tokens") or 0)
    cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    reasoning = (u.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    return TokenCounts(
        input_tokens=prompt,
        output_tokens=completion,
        total_tokens=int(u.get("total_tokens") or prompt + completion),
        cached_tokens=int(cached),
        reasoning_tokens=int(reasoning),
    )


def _status_of(record: dict[str, Any]) -> int | None:
    response = record.get("response")
    return int(response["status_code"]) if response else None


def _describe(err: Exception) -> str:
    return f"{type(err).__name__}: {err}"[:500]


@contextlib.asynccontextmanager
async def _heartbeating() -> AsyncIterator[None]:
    """Heartbeat every few seconds while the body waits (so a dead worker is noticed)."""

    async def beat() -> None:
        while True:  # not at once: a heartbeat per short line is a server write per line
            await asyncio.sleep(HEARTBEAT_EVERY)
            activity.heartbeat()

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
