"""The line activity: send one batch line to its route and commit its result record.

A method of a class that receives its clients (settings, file store, httpx client), built once
in `worker/`. Results are committed to the store first-writer-wins, so a line whose activity ran
twice (a worker died after writing) is committed exactly once. Store I/O runs in threads of its
own, so a slow disk never stalls heartbeats or other lines' responses on the event loop.

Its parts: one run of the line (`activities.lines.attempt`, which the others take whole), the
record of each answer (`activities.lines.answers`), the send that gives its seat back to live
traffic (`activities.preemption.send`), and the streamed rebuild of a line that may be resumed
(`activities.lines.streamed`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import httpx
from temporalio import activity

from activities.heartbeat import heartbeating
from activities.lines.answers import Answer, failed, parse_retry_after, unexpected
from activities.lines.attempt import LineAttempt
from activities.lines.streamed import (
    REFUSED_CONTINUATION,
    kept_partial,
    reassembled,
    resume,
    stream_for,
)
from activities.preemption.board import PreemptBoard
from activities.preemption.send import send_preemptible
from backfill.batches.records import (
    custom_id_in,
    describe_error,
    outcome_from_record,
    placeholder_custom_id,
)
from backfill.batches.streamed_answer import StreamError, streamed_body
from backfill.files import Store
from backfill.platform import metrics, strict_json, tracing
from backfill.platform.config import Settings
from backfill.platform.messages import LineInput, LineOutcome
from backfill.tenancy.byte_budget import ByteBudget, Claim
from backfill.upstream.request import build_upstream_request, upstream_body
from backfill.usage.journal import UsageAccount, UsageJournal, new_request_id

CONNECT_TIMEOUT = 10.0
"""Seconds to open a connection to the upstream (the line timeout bounds the rest)."""
MAX_RESENDS = 2
"""Times a request that got no answer at all is sent again at once (see `_send_answered`)."""
STORE_THREADS = 32
"""Threads for the lines' store reads and fsync'd commits. asyncio's default pool (cores + 4
threads, 6 here) made 256 lines in flight queue for the disk behind each other."""
BUFFER_WAIT_SECONDS = 30.0
"""Longest a line waits for room in the worker's buffer budget before it goes back to its queue
unsent (`held`: nothing counted), as a line waits at the preemption door."""
BUFFER_POLL_SECONDS = 0.25
"""How often a waiting line looks for room again."""
REQUEST_COPIES = 3
"""What a running line's request holds, in its input line's size: the line as read, its
decoding, and the body encoded to be sent."""
ANSWER_COPIES = 2
"""What an answer holds while it is read and recorded, in its size: the bytes read and the
record made of them."""
T = TypeVar("T")
UNANSWERED = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)
"""Transport errors that, raised before the response's status line, mean the server never
answered: typically a pooled keep-alive connection it closed as the request went out."""


class LineActivities:
    def __init__(
        self,
        settings: Settings,
        store: Store,
        http: httpx.AsyncClient,
        usage: UsageJournal | None = None,
        preempt: PreemptBoard | None = None,
        buffers: ByteBudget | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.http = http
        self.usage = usage
        """Where every attempt sent upstream is journaled (None: nowhere)."""
        self.preempt = preempt
        """Where lines learn that live traffic needs their seat (None: never preempted)."""
        self.buffers = buffers or ByteBudget(
            settings.worker_buffer_bytes, settings.worker_buffer_workspace_bytes, "worker_lines"
        )
        """The process's budget for what running lines hold (requests and answers), a share
        per workspace (`Settings.worker_buffer_bytes`)."""
        self._io = ThreadPoolExecutor(STORE_THREADS, thread_name_prefix="line-store")

    async def _in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._io, fn, *args)

    @activity.defn
    async def run_line(self, input: LineInput) -> LineOutcome:
        started = time.monotonic()
        outcome = await self._run_line(input)
        # Committed: a finished line (a re-run of a committed one too).
        if not outcome.retry and not outcome.preempted:
            metrics.LINE_OUTCOMES.labels(
                input.route_id, metrics.outcome_class(outcome.status_code, outcome.ok)
            ).inc()
            metrics.LINE_SECONDS.labels(input.route_id).observe(time.monotonic() - started)
        return outcome

    async def _run_line(self, input: LineInput) -> LineOutcome:
        with self.buffers.claim(input.workspace or "") as claim:
            return await self._run_claimed(input, claim)

    async def _room(self, claim: Claim, size: int) -> bool:
        """Whether `claim` could grow to `size` within `BUFFER_WAIT_SECONDS` (heartbeating)."""
        if claim.resize(size):
            return True
        async with heartbeating():
            deadline = time.monotonic() + BUFFER_WAIT_SECONDS
            while time.monotonic() < deadline:
                await asyncio.sleep(BUFFER_POLL_SECONDS)
                if claim.resize(size):
                    return True
        return False

    async def _run_claimed(self, input: LineInput, claim: Claim) -> LineOutcome:
        line_no, committed, raw = await self._in_thread(self._read, input)
        if committed is not None:  # it ran before (its worker died after writing): once only
            return outcome_from_record(line_no, committed)
        if not await self._room(claim, REQUEST_COPIES * len(raw)):
            activity.logger.info("line %d of %s held: no buffer room", line_no, input.batch_id)
            return LineOutcome(line=line_no, preempted=True, held=True)
        # The line is read once: custom_id and body both come from this decoding.
        request: Any = None
        unreadable: Answer | None = None
        try:
            request = strict_json.loads(raw)
        except ValueError as err:  # validated, so only a line older than today's rules
            msg = f"The request line is not accepted: {strict_json.describe(err)}."
            unreadable = failed(placeholder_custom_id(line_no), line_no, "invalid_json_line", msg)
        except Exception as err:
            unreadable = unexpected(placeholder_custom_id(line_no), line_no, err)
        custom_id = custom_id_in(request, line_no)
        if input.give_up_code is not None:
            answer = failed(custom_id, line_no, input.give_up_code, input.give_up_message or "")
            return await self._commit(input.batch_id, answer)
        if unreadable is not None:
            return await self._commit(input.batch_id, unreadable)
        route = self.settings.route(input.route_id)
        if route is None:
            msg = f"Route {input.route_id!r} is no longer configured."
            return await self._commit(
                input.batch_id, failed(custom_id, line_no, "route_removed", msg)
            )
        attempt = LineAttempt(
            input=input,
            line_no=line_no,
            custom_id=custom_id,
            request=request,
            route=route,
            rid=new_request_id(),
            timeout=self._timeout(input),
            claim=claim,
        )
        attempt.stream = stream_for(self.preempt, attempt)
        if attempt.stream is not None and input.preemptions > 0:  # preempted before: it may go on
            partial = await self._in_thread(kept_partial, self.store, input.batch_id, line_no)
            if partial is not None:
                # Its text is held, and sent again in the continued request: counted as one.
                if not await self._room(claim, REQUEST_COPIES * (len(raw) + len(partial.text))):
                    return attempt.held().outcome
                finished = resume(attempt, partial)
                if finished is not None:  # its token limit was reached as it was preempted
                    return await self._commit(input.batch_id, finished)
        return await self._attempt(attempt)

    async def _attempt(self, attempt: LineAttempt) -> LineOutcome:
        """Send the attempt (through the preemption board when this worker has one), journal
        it, and commit its answer; or hand the line back to the queue."""
        input = attempt.input
        try:
            async with heartbeating():
                send = self._send(attempt)
                if self.preempt is None:
                    answer = await send
                else:
                    answer = await send_preemptible(self.preempt, attempt, send)
                if not answer.outcome.held:  # a line held at the door sent nothing
                    self._journal(attempt, answer)  # now: a cancel may end the `with`
                    if attempt.resent:  # the continuation went upstream: its prompt again
                        metrics.REPREFILL_TOKENS.labels(input.route_id).inc(attempt.resent)
                        update = {"reprefill_tokens": attempt.resent}
                        answer = dataclasses.replace(
                            answer, outcome=answer.outcome.model_copy(update=update)
                        )
        except Exception as err:  # a bug, not an answer: the line ends failed, never lost
            activity.logger.exception(
                "line %d of %s failed unexpectedly", attempt.line_no, input.batch_id
            )
            return await self._commit(input.batch_id, attempt.unexpected(err))
        if answer.outcome.held:
            return answer.outcome
        if answer.outcome.preempted:  # nothing is committed: the line runs again later
            return await self._keep(attempt, answer.outcome)
        if attempt.continues and answer.outcome.status_code in REFUSED_CONTINUATION:
            # The server does not continue answers (resume should be off on this route): the
            # partial answer is dropped and the line restarts.
            await self._in_thread(self.store.put_partial, input.batch_id, attempt.line_no, b"{}")
            return attempt.again(answer.outcome.status_code)
        if answer.retry and not input.final_attempt:
            return attempt.again(answer.outcome.status_code, answer.retry_after)
        return await self._commit(input.batch_id, answer)

    async def _keep(self, attempt: LineAttempt, outcome: LineOutcome) -> LineOutcome:
        """A preempted line's end: what it generated is kept for its next run where it can
        continue (nothing is wasted), and its cost counted."""
        input, line_no, stream = attempt.input, attempt.line_no, attempt.stream
        wasted = outcome.wasted_tokens
        partial = stream.partial() if stream is not None else None
        if partial is not None:
            data = partial.model_dump_json().encode()
            await self._in_thread(self.store.put_partial, input.batch_id, line_no, data)
            wasted = 0
        metrics.PREEMPTED_LINES.labels(input.route_id).inc()
        metrics.WASTED_TOKENS.labels(input.route_id).inc(wasted)
        activity.logger.info(
            "line %d of %s preempted for live traffic (%s)",
            line_no,
            input.batch_id,
            f"{partial.completion_tokens} tokens kept" if partial else f"~{wasted} tokens wasted",
        )
        return outcome.model_copy(update={"wasted_tokens": wasted})

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

    def _journal(self, attempt: LineAttempt, answer: Answer) -> None:
        """One usage entry for the attempt just made, under the batch's identity snapshot."""
        if self.usage is None:
            return
        input = attempt.input
        out, body = answer.outcome, attempt.request.get("body")
        model = body.get("model") if isinstance(body, dict) else None
        payer = UsageAccount(
            workspace=input.workspace or "",
            key_id=input.key_id,
            model=model if isinstance(model, str) else "",
            route=input.route_id,
            service_class="batch",
            batch_id=input.batch_id,
        )
        status = str(out.status_code) if out.status_code else (out.error_code or "error")
        usage = out.usage
        self.usage.record(
            payer.entry(
                attempt.rid,
                status,
                usage.input_tokens if usage else 0,
                usage.output_tokens if usage else 0,
            )
        )

    async def _send(self, attempt: LineAttempt) -> Answer:
        """`_exchange`, in a trace's upstream span (identifiers only, never the body)."""
        input, route = attempt.input, attempt.route
        path = httpx.URL(route.base_url.rstrip("/") + attempt.spec.upstream_path).path
        with tracing.upstream_span(
            path,
            route.id,
            attempt.rid,
            batch_id=input.batch_id,
            line=attempt.line_no,
            workspace=input.workspace,
        ) as span:
            answer = await self._exchange(attempt)
            tracing.answered(span, answer.outcome.status_code, answer.outcome.error_code)
            return answer

    async def _exchange(self, attempt: LineAttempt) -> Answer:
        """Send the attempt's request (`X-Request-ID: rid`) and turn whatever comes back into
        the line's record. The client's own `priority` is dropped; the route's hint added (vllm
        only). With a stream, the request asks for one, and the stream puts its events back
        together as they come (so what was generated is known if the line is preempted). The
        answer grows the attempt's claim (what the line holds of the worker's buffer budget) as
        it comes: one it cannot hold is given up and sent again later (`worker_busy`)."""
        input, route, stream = attempt.input, attempt.route, attempt.stream
        body = attempt.sent["body"] if stream is None else streamed_body(attempt.sent["body"])
        body = upstream_body(body, route, input.priority, endpoint=input.endpoint)
        limit = self.settings.limits.max_response_bytes
        claim = attempt.claim
        held = claim.size if claim is not None else 0
        timeout = attempt.timeout
        try:
            # The whole exchange, not each read, is bounded by the line timeout.
            async with asyncio.timeout(timeout):
                resp = await self._send_answered(
                    build_upstream_request(
                        self.http,
                        route,
                        attempt.spec,
                        body,
                        attempt.rid,
                        timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT),
                        headers={"X-Backfill-Batch": input.batch_id},
                    )
                )
                status = resp.status_code
                content_type = resp.headers.get("content-type", "no content type")
                streamed = stream is not None and status == 200
                streamed = streamed and content_type.startswith("text/event-stream")
                try:
                    answered = bytearray()
                    async for chunk in resp.aiter_bytes():
                        if streamed:
                            assert stream is not None
                            stream.feed(chunk)
                            size = stream.chars
                        else:
                            answered += chunk
                            size = len(answered)
                        if size > limit:
                            msg = f"The response was larger than the {limit}-byte cap."
                            return attempt.failed("response_too_large", msg)
                        if claim is not None and not claim.resize(held + ANSWER_COPIES * size):
                            msg = "The worker had no room left for this answer; it is sent again."
                            return attempt.failed("worker_busy", msg, retry=True)
                finally:
                    await resp.aclose()
                if streamed:
                    assert stream is not None
                    answered = bytearray(reassembled(stream))
                    content_type = "application/json"
                retry_after = parse_retry_after(resp.headers.get("retry-after"))
        except httpx.ConnectTimeout:
            msg = f"Could not connect to the upstream within {CONNECT_TIMEOUT:g} s."
            return attempt.failed("connection_error", msg, retry=True)
        except httpx.ConnectError as err:
            return attempt.failed("connection_error", describe_error(err), retry=True)
        except (TimeoutError, httpx.TimeoutException):
            return attempt.failed("request_timeout", f"No complete response within {timeout:g} s.")
        except httpx.TransportError as err:  # reset, closed mid-answer: transient
            return attempt.failed("upstream_error", describe_error(err), retry=True)
        except StreamError as err:  # an error event, a stream cut short: transient
            msg = f"The streamed answer could not be read: {err}."
            return attempt.failed("upstream_error", msg, retry=True)
        except httpx.HTTPError as err:
            return attempt.failed("upstream_error", describe_error(err))
        # The bytearray itself, not a copy: with 256 lines of 8 MB in flight, copies add up.
        answer = attempt.answered(status, content_type, answered)
        return dataclasses.replace(answer, retry_after=retry_after) if answer.retry else answer

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

    async def _commit(self, batch_id: str, answer: Answer) -> LineOutcome:
        line_no = answer.outcome.line
        committed, mine = await self._in_thread(
            self.store.commit_result, batch_id, line_no, answer.data
        )
        return answer.outcome if mine else outcome_from_record(line_no, committed)
