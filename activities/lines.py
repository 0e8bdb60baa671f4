"""The line activity: send one batch line to its route and commit its result record.

A method of a class that receives its clients (settings, file store, httpx client), built once
in `worker/`. Results are committed to the store first-writer-wins, so a line whose activity ran
twice (a worker died after writing) is committed exactly once. Store I/O runs in threads of its
own, so a slow disk never stalls heartbeats or other lines' responses on the event loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar

import httpx
from temporalio import activity

from activities.heartbeat import heartbeating
from activities.preemption import PreemptBoard
from backfill import metrics, strict_json, tracing
from backfill.config import RouteConfig, Settings
from backfill.endpoints import REGISTRY, EndpointSpec
from backfill.messages import LineInput, LineOutcome
from backfill.records import (
    custom_id_in,
    describe_error,
    error_record_bytes,
    outcome_from_record,
    placeholder_custom_id,
    response_record_bytes,
    usage_of,
)
from backfill.store import Store
from backfill.streamed_answer import (
    Partial,
    Reassembled,
    StreamError,
    continued_body,
    finished_answer,
    streamable,
    streamed_body,
)
from backfill.upstream_request import build_upstream_request, upstream_body
from backfill.usage import UsageAccount, UsageJournal, new_request_id

RETRYABLE_STATUS = frozenset({429, 502, 503, 504})
"""Answers that say "not now" rather than "no": the line goes back to the queue and the route
backs off (a bounded number of times, then the answer is recorded)."""
CONNECT_TIMEOUT = 10.0
"""Seconds to open a connection to the upstream (the line timeout bounds the rest)."""
MAX_RESENDS = 2
"""Times a request that got no answer at all is sent again at once (see `_send_answered`)."""
STORE_THREADS = 32
"""Threads for the lines' store reads and fsync'd commits. asyncio's default pool (cores + 4
threads, 6 here) made 256 lines in flight queue for the disk behind each other."""
T = TypeVar("T")
REFUSED_CONTINUATION = frozenset({400, 422})
"""A continuation (`continue_final_message`) the server refused as a request: it does not
continue answers, and the line restarts."""
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
    ) -> None:
        self.settings = settings
        self.store = store
        self.http = http
        self.usage = usage
        """Where every attempt sent upstream is journaled (None: nowhere)."""
        self.preempt = preempt
        """Where lines learn that live traffic needs their seat (None: never preempted)."""
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
        line_no, committed, raw = await self._in_thread(self._read, input)
        if committed is not None:  # it ran before (its worker died after writing): once only
            return outcome_from_record(line_no, committed)
        # The line is read once: custom_id and body both come from this decoding.
        request: Any = None
        unreadable: Answer | None = None
        try:
            request = strict_json.loads(raw)
        except ValueError as err:  # validated, so only a line older than today's rules
            msg = f"The request line is not accepted: {strict_json.describe(err)}."
            unreadable = _failed(placeholder_custom_id(line_no), line_no, "invalid_json_line", msg)
        except Exception as err:
            unreadable = _unexpected(placeholder_custom_id(line_no), line_no, err)
        custom_id = custom_id_in(request, line_no)
        if input.give_up_code is not None:
            answer = _failed(custom_id, line_no, input.give_up_code, input.give_up_message or "")
            return await self._commit(input.batch_id, answer)
        if unreadable is not None:
            return await self._commit(input.batch_id, unreadable)
        route = self.settings.route(input.route_id)
        if route is None:
            msg = f"Route {input.route_id!r} is no longer configured."
            return await self._commit(
                input.batch_id, _failed(custom_id, line_no, "route_removed", msg)
            )
        rid = new_request_id()
        stream = self._stream(route, input, request)
        sent, resent = request, 0
        if stream is not None and input.preemptions > 0:  # preempted before: it may continue
            partial = await self._in_thread(self._kept, input, line_no)
            if partial is not None:
                body = continued_body(input.endpoint, request["body"], partial)
                if body is None:  # its token limit was reached as it was preempted: complete
                    done = finished_answer(partial, stream.chat)
                    data = json.dumps(done, separators=(",", ":"), ensure_ascii=False).encode()
                    spec = REGISTRY[input.endpoint]
                    answer = _answer(custom_id, line_no, 200, rid, "application/json", data, spec)
                    return await self._commit(input.batch_id, answer)
                sent = {**request, "body": body}
                stream = Reassembled(stream.chat, before=partial)
                resent = (partial.prompt_tokens or 0) + partial.completion_tokens
        try:
            async with heartbeating():
                if self.preempt is None:
                    answer = await self._send(route, input, request, custom_id, line_no, rid)
                else:
                    send = self._send(route, input, sent, custom_id, line_no, rid, stream)
                    answer = await self._send_preemptible(
                        self.preempt, input, line_no, send, stream
                    )
                if not answer.outcome.held:  # a line held at the door sent nothing
                    self._journal(input, request, rid, answer)  # now: a cancel may end the `with`
                    if resent:  # the continuation went upstream: its prompt was sent again
                        metrics.REPREFILL_TOKENS.labels(input.route_id).inc(resent)
                        again = answer.outcome.model_copy(update={"reprefill_tokens": resent})
                        answer = dataclasses.replace(answer, outcome=again)
        except Exception as err:  # a bug, not an answer: the line ends failed, never lost
            activity.logger.exception("line %d of %s failed unexpectedly", line_no, input.batch_id)
            return await self._commit(input.batch_id, _unexpected(custom_id, line_no, err))
        if answer.outcome.held:
            return answer.outcome
        if answer.outcome.preempted:  # nothing is committed: the line runs again later
            return await self._keep(input, line_no, stream, answer.outcome)
        if sent is not request and answer.outcome.status_code in REFUSED_CONTINUATION:
            # The server does not continue answers (resume should be off on this route): the
            # partial answer is dropped and the line restarts.
            await self._in_thread(self.store.put_partial, input.batch_id, line_no, b"{}")
            return LineOutcome(
                line=line_no,
                retry=True,
                status_code=answer.outcome.status_code,
                reprefill_tokens=resent,
            )
        if answer.retry and not input.final_attempt:
            return LineOutcome(
                line=line_no,
                retry=True,
                status_code=answer.outcome.status_code,
                retry_after=answer.retry_after,
                reprefill_tokens=resent,
            )
        return await self._commit(input.batch_id, answer)

    async def _send_preemptible(
        self,
        board: PreemptBoard,
        input: LineInput,
        line_no: int,
        send: Coroutine[Any, Any, Answer],
        stream: Reassembled | None = None,
    ) -> Answer:
        """`send` unless live traffic needs the seat first: then the upstream request is closed
        (the server aborts it) and the answer says `preempted`, with the tokens it generated
        (`stream`'s count, else an estimate). An answer that is complete when the preemption
        comes is kept (it is committed like any other)."""
        ticket = board.enter(input.route_id, input.preemptions)
        try:
            try:
                may_send = await board.door(ticket)
            except BaseException:
                send.close()  # never sent: cancelled while it waited for a seat
                raise
            if not may_send:  # no seat within the door's limit: back to the queue, not a try
                send.close()
                return Answer(b"", LineOutcome(line=line_no, preempted=True, held=True))
            sent = asyncio.ensure_future(send)
            stop = asyncio.ensure_future(ticket.preempted.wait())
            try:
                await asyncio.wait((sent, stop), return_when=asyncio.FIRST_COMPLETED)
            finally:
                stop.cancel()
                if not sent.done():
                    sent.cancel()
                    await asyncio.wait((sent,))  # the connection is closed before we go on
            if not sent.cancelled():
                answer = sent.result()
                usage = answer.outcome.usage
                tokens = usage.output_tokens if usage is not None else 0
                board.finished(ticket, stream.generated() if stream is not None else tokens)
                return answer
            generated = stream.generated() if stream is not None else board.wasted_tokens(ticket)
            outcome = LineOutcome(
                line=line_no, error_code="preempted", preempted=True, wasted_tokens=generated
            )
            return Answer(b"", outcome)
        finally:
            board.leave(ticket)

    def _stream(
        self, route: RouteConfig, input: LineInput, request: dict[str, Any]
    ) -> Reassembled | None:
        """Where a line that goes upstream streamed is put back together (None: it goes as it
        came). Streamed: a line that may be preempted and resumed (its route's preemption is on
        with `resume`, on this worker's board), on a self-hosted route, whose answer a stream
        rebuilds exactly
        (`backfill.streamed_answer`, decision 0036)."""
        body = request.get("body")
        if (
            self.preempt is None
            or route.provider != "vllm"
            or not self.preempt.resumes(input.route_id)
            or not isinstance(body, dict)
            or not streamable(input.endpoint, body)
        ):
            return None
        return Reassembled(chat=input.endpoint == "/v1/chat/completions")

    def _kept(self, input: LineInput, line_no: int) -> Partial | None:
        """The partial answer an earlier run of the line kept (None: none, or unreadable)."""
        data = self.store.get_partial(input.batch_id, line_no)
        if data is None:
            return None
        try:
            return Partial.model_validate_json(data)
        except ValueError:  # dropped (`{}`), or written by other code: the line restarts
            return None

    async def _keep(
        self, input: LineInput, line_no: int, stream: Reassembled | None, outcome: LineOutcome
    ) -> LineOutcome:
        """A preempted line's end: what it generated is kept for its next run where it can
        continue (nothing is wasted), and its cost counted."""
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

    def _journal(self, input: LineInput, request: dict[str, Any], rid: str, answer: Answer) -> None:
        """One usage entry for the attempt just made, under the batch's identity snapshot."""
        if self.usage is None:
            return
        out, body = answer.outcome, request.get("body")
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
                rid,
                status,
                usage.input_tokens if usage else 0,
                usage.output_tokens if usage else 0,
            )
        )

    async def _send(
        self,
        route: RouteConfig,
        input: LineInput,
        request: dict[str, Any],
        custom_id: str,
        line_no: int,
        rid: str,
        stream: Reassembled | None = None,
    ) -> Answer:
        """`_exchange`, in a trace's upstream span (identifiers only, never the body)."""
        path = httpx.URL(route.base_url.rstrip("/") + REGISTRY[input.endpoint].upstream_path).path
        with tracing.upstream_span(
            path, route.id, rid, batch_id=input.batch_id, line=line_no, workspace=input.workspace
        ) as span:
            answer = await self._exchange(route, input, request, custom_id, line_no, rid, stream)
            tracing.answered(span, answer.outcome.status_code, answer.outcome.error_code)
            return answer

    async def _exchange(
        self,
        route: RouteConfig,
        input: LineInput,
        request: dict[str, Any],
        custom_id: str,
        line_no: int,
        rid: str,
        stream: Reassembled | None = None,
    ) -> Answer:
        """Send one request (`X-Request-ID: rid`) and turn whatever comes back into the line's
        record. The client's own `priority` is dropped; the route's hint added (vllm only).
        With `stream`, the request asks for a stream, and `stream` puts its events back together
        as they come (so what was generated is known if the line is preempted)."""
        spec = REGISTRY[input.endpoint]
        sent = request["body"] if stream is None else streamed_body(request["body"])
        body = upstream_body(sent, route, input.priority, endpoint=input.endpoint)
        limit = self.settings.limits.max_response_bytes
        timeout = self._timeout(input)
        try:
            # The whole exchange, not each read, is bounded by the line timeout.
            async with asyncio.timeout(timeout):
                resp = await self._send_answered(
                    build_upstream_request(
                        self.http,
                        route,
                        spec,
                        body,
                        rid,
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
                            return _failed(custom_id, line_no, "response_too_large", msg)
                finally:
                    await resp.aclose()
                if streamed:
                    assert stream is not None
                    answered = bytearray(_reassembled(stream))
                    content_type = "application/json"
                retry_after = parse_retry_after(resp.headers.get("retry-after"))
        except httpx.ConnectTimeout:
            msg = f"Could not connect to the upstream within {CONNECT_TIMEOUT:g} s."
            return _failed(custom_id, line_no, "connection_error", msg, retry=True)
        except httpx.ConnectError as err:
            msg = describe_error(err)
            return _failed(custom_id, line_no, "connection_error", msg, retry=True)
        except (TimeoutError, httpx.TimeoutException):
            msg = f"No complete response within {timeout:g} s."
            return _failed(custom_id, line_no, "request_timeout", msg)
        except httpx.TransportError as err:  # reset, closed mid-answer: transient
            return _failed(custom_id, line_no, "upstream_error", describe_error(err), retry=True)
        except StreamError as err:  # an error event, a stream cut short: transient
            msg = f"The streamed answer could not be read: {err}."
            return _failed(custom_id, line_no, "upstream_error", msg, retry=True)
        except httpx.HTTPError as err:
            return _failed(custom_id, line_no, "upstream_error", describe_error(err))
        # The bytearray itself, not a copy: with 256 lines of 8 MB in flight, copies add up.
        answer = _answer(custom_id, line_no, status, rid, content_type, answered, spec)
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


@dataclass(frozen=True)
class Answer:
    """A line's record as bytes, its outcome, and whether it is worth sending again."""

    data: bytes
    outcome: LineOutcome
    retry: bool = False
    retry_after: float | None = None
    """The upstream's Retry-After, in seconds."""


def _failed(
    custom_id: str, line_no: int, code: str, message: str, *, retry: bool = False
) -> Answer:
    data = error_record_bytes(custom_id, code, message)
    return Answer(data, LineOutcome(line=line_no, error_code=code), retry)


def _reassembled(stream: Reassembled) -> bytes:
    """The non-streamed answer a complete stream makes, as compact UTF-8 JSON."""
    stream.end()
    if not stream.done:
        raise StreamError("the stream ended before its last event ([DONE])")
    return json.dumps(stream.answer(), separators=(",", ":"), ensure_ascii=False).encode()


def _unexpected(custom_id: str, line_no: int, err: Exception) -> Answer:
    """The record of a line that hit a bug (or a line too odd for today's rules): failed, so
    the batch goes on instead of sending it again forever."""
    return _failed(custom_id, line_no, "internal_error", describe_error(err))


def _answer(
    custom_id: str,
    line_no: int,
    status: int,
    request_id: str,
    content_type: str,
    body: bytes | bytearray,
    spec: EndpointSpec | None = None,
) -> Answer:
    """The record of a complete HTTP answer. A 2xx must be a JSON object to count as completed;
    the body is written as it came (valid JSON) or, when it is not JSON, wrapped in an error.

    Memory: the parsed answer is only looked at (is it an object, its usage) and dropped before
    the record is built from the original bytes, so a line holds at most the body, its text and
    its parse at once, then the body and the record."""
    ok = 200 <= status < 300
    parsed: Any = None
    is_json = False
    try:
        parsed = strict_json.loads(body, finite=False)  # kept as it came, only looked at
        is_json = True
    except ValueError:
        pass
    if ok and not isinstance(parsed, dict):
        what = "not JSON" if not is_json else f"JSON but not an object ({type(parsed).__name__})"
        snippet = bytes(body[:200]).decode("utf-8", errors="replace")
        msg = f"The upstream answered {status} with a body that is {what} ({content_type}): "
        return _failed(custom_id, line_no, "invalid_response", msg + repr(snippet))
    fields = spec.usage if spec is not None else None
    usage = usage_of(parsed.get("usage"), fields) if isinstance(parsed, dict) else None
    if usage is None and fields is not None and isinstance(parsed, dict):
        # Counts in another endpoint's layout are still tokens spent, and are what a reader of
        # the record finds (`records.outcome_from_record` reads whichever layout has them).
        usage = usage_of(parsed.get("usage"))
    del parsed
    if is_json:  # valid UTF-8 JSON: its bytes are exactly the text's, spliced in as they came
        data = response_record_bytes(custom_id, status, request_id, body)
    else:  # an error answer that is not JSON: keep its text, readable
        snippet = bytes(body[:2000]).decode("utf-8", errors="replace")
        text = json.dumps({"error": {"message": snippet}}, separators=(",", ":"))
        data = response_record_bytes(custom_id, status, request_id, text)
    outcome = LineOutcome(
        line=line_no,
        ok=ok,
        status_code=status,
        error_code=None if ok else f"http_{status}",
        usage=usage,
    )
    return Answer(data, outcome, status in RETRYABLE_STATUS)


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Retry-After as seconds from now: delta-seconds or an HTTP date (RFC 9110); None when
    absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))
