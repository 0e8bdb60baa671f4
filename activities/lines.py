"""The line activity: send one batch line to its route and commit its result record.

A method of a class that receives its clients (settings, file store, httpx client), built once
in `worker/`. Results are committed to the store first-writer-wins, so a line whose activity ran
twice (a worker died after writing) is committed exactly once. Store I/O runs in threads of its
own, so a slow disk never stalls heartbeats or other lines' responses on the event loop.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import httpx
from temporalio import activity

from activities.heartbeat import heartbeating
from activities.records import (
    describe_error,
    error_record,
    new_record_id,
    outcome_from_record,
    status_of,
)
from backfill.config import RouteConfig, Settings
from backfill.store import FileStore
from workflows.messages import LineInput, LineOutcome

RETRYABLE_STATUS = frozenset({429, 503})
MAX_RESENDS = 2
"""Times a request that got no answer at all is sent again at once (see `_send_answered`)."""
STORE_THREADS = 32
"""Threads for the lines' store reads and fsync'd commits. asyncio's default pool (cores + 4
threads, 6 here) made 256 lines in flight queue for the disk behind each other."""
T = TypeVar("T")
UNANSWERED = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)
"""Transport errors that, raised before the response's status line, mean the server never
answered: typically a pooled keep-alive connection it closed as the request went out."""


class LineActivities:
    def __init__(self, settings: Settings, store: FileStore, http: httpx.AsyncClient) -> None:
        self.settings = settings
        self.store = store
        self.http = http
        self._io = ThreadPoolExecutor(STORE_THREADS, thread_name_prefix="line-store")

    async def _in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._io, fn, *args)

    @activity.defn
    async def run_line(self, input: LineInput) -> LineOutcome:
        line_no, committed, raw = await self._in_thread(self._read, input)
        if committed is not None:  # it ran before (its worker died after writing): once only
            return outcome_from_record(line_no, committed)
        custom_id = _custom_id(raw, line_no)
        if input.give_up_code is not None:
            record = error_record(custom_id, input.give_up_code, input.give_up_message or "")
            return await self._commit(input.batch_id, line_no, record)
        route = self.settings.route(input.route_id)
        if route is None:
            record = error_record(
                custom_id, "route_removed", f"Route {input.route_id!r} is no longer configured."
            )
            return await self._commit(input.batch_id, line_no, record)
        request = json.loads(raw)
        async with heartbeating():
            record, retry = await self._send(route, input, request)
        if retry and not input.final_attempt:
            return LineOutcome(line=line_no, retry=True, status_code=status_of(record))
        return await self._commit(input.batch_id, line_no, record)

    def _read(self, input: LineInput) -> tuple[int, bytes | None, bytes]:
        """(line number, its committed record if any, the input line) in one trip to the disk."""
        line_no = self.store.line_number(input.batch_id, input.route_index, input.position)
        committed = self.store.get_result(input.batch_id, line_no)
        if committed is not None:
            return line_no, committed, b""
        return line_no, None, self.store.read_line(input.batch_id, input.input_file_id, line_no)

    def _timeout(self, input: LineInput) -> float:
        """The workflow's timeout for this line (it sized the activity's timeout from it);
        a line scheduled before the field existed uses this worker's setting."""
        if input.timeout_seconds is not None:
            return input.timeout_seconds
        return self.settings.limits.line_timeout_seconds

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
        timeout = self._timeout(input)
        try:
            # The whole exchange, not each read, is bounded by the line timeout.
            async with asyncio.timeout(timeout):
                resp = await self._send_answered(
                    self.http.build_request(
                        "POST",
                        url,
                        content=json.dumps(request["body"]).encode(),
                        headers=headers,
                        timeout=httpx.Timeout(None, connect=10.0),
                    )
                )
                try:
                    body = bytearray()
                    async for chunk in resp.aiter_bytes():
                        body += chunk
                        if len(body) > limit:
                            msg = f"The response was larger than the {limit}-byte cap."
                            return error_record(custom_id, "response_too_large", msg), False
                finally:
                    await resp.aclose()
                request_id = resp.headers.get("x-request-id") or new_record_id()
                status = resp.status_code
        except httpx.ConnectError as err:
            return error_record(custom_id, "connection_error", describe_error(err)), True
        except (TimeoutError, httpx.TimeoutException):
            msg = f"No complete response within {timeout} s."
            return error_record(custom_id, "request_timeout", msg), False
        except httpx.HTTPError as err:
            return error_record(custom_id, "upstream_error", describe_error(err)), False
        try:
            parsed: Any = json.loads(body)
        except ValueError:
            parsed = {"error": {"message": body[:2000].decode(errors="replace")}}
        record = {
            "id": new_record_id(),
            "custom_id": custom_id,
            "response": {"status_code": status, "request_id": request_id, "body": parsed},
            "error": None,
        }
        return record, status in RETRYABLE_STATUS

    async def _send_answered(self, request: httpx.Request) -> httpx.Response:
        """The response (status and headers read, body still streaming) to `request`.

        A request that failed before any response arrived (the server closed the connection as
        it went out: keep-alive race) is not the server's answer: it is sent again at once, at
        most MAX_RESENDS times. An error once the response has started is the caller's."""
        for resend in range(MAX_RESENDS + 1):
            try:
                return await self.http.send(request, stream=True)
            except UNANSWERED as err:
                if resend == MAX_RESENDS:
                    raise
                activity.logger.info("no answer (%s); sending again", describe_error(err))
        raise AssertionError("unreachable")

    async def _commit(self, batch_id: str, line_no: int, record: dict[str, Any]) -> LineOutcome:
        data = json.dumps(record, separators=(",", ":")).encode()
        committed, _ = await self._in_thread(self.store.commit_result, batch_id, line_no, data)
        return outcome_from_record(line_no, committed)


def _custom_id(raw: bytes, line_no: int) -> str:
    try:
        return str(json.loads(raw)["custom_id"])
    except (ValueError, KeyError, TypeError):
        return f"line-{line_no + 1}"
