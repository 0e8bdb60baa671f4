"""The streamed rebuild of a batch line: which lines go upstream streamed, the non-streamed
answer their stream makes, and how a preempted one continues what it kept (decision 0036).

A line that may be preempted and resumed goes upstream streamed; `backfill.batches.streamed_answer`
(pure) puts its events back together as they come. A preempted line keeps what it generated in
the store (`Partial`); its next run sends the request that continues it. The line activity
(`activities.lines.run_line`) does the store I/O and the sending.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from activities.lines.answers import Answer
from activities.lines.attempt import LineAttempt
from activities.preemption.board import PreemptBoard
from backfill.batches.streamed_answer import (
    Partial,
    Reassembled,
    StreamError,
    continued_body,
    finished_answer,
    streamable,
)
from backfill.files import Store

REFUSED_CONTINUATION = frozenset({400, 422})
"""A continuation (`continue_final_message`) the server refused as a request: it does not
continue answers, and the line restarts."""


def stream_for(board: PreemptBoard | None, attempt: LineAttempt) -> Reassembled | None:
    """Where a line that goes upstream streamed is put back together (None: it goes as it
    came). Streamed: a line that may be preempted and resumed (its route's preemption is on
    with `resume`, on this worker's `board`), on a self-hosted route, whose answer a stream
    rebuilds exactly (`backfill.batches.streamed_answer`, decision 0036)."""
    body, endpoint = attempt.request.get("body"), attempt.input.endpoint
    if (
        board is None
        or attempt.route.provider != "vllm"
        or not board.resumes(attempt.input.route_id)
        or not isinstance(body, dict)
        or not streamable(endpoint, body)
    ):
        return None
    return Reassembled(chat=endpoint == "/v1/chat/completions")


def kept_partial(store: Store, batch_id: str, line_no: int) -> Partial | None:
    """The partial answer an earlier run of the line kept (None: none, or unreadable)."""
    data = store.get_partial(batch_id, line_no)
    if data is None:
        return None
    try:
        return Partial.model_validate_json(data)
    except ValueError:  # dropped (`{}`), or written by other code: the line restarts
        return None


@dataclass(frozen=True)
class Continuation:
    """The run of a line that continues the partial answer an earlier run kept."""

    request: dict[str, Any]
    """The line's request with the body that continues the partial answer."""
    stream: Reassembled
    """Joins the partial answer and what the continuation streams into one answer."""
    resent: int
    """Tokens sent upstream again: the partial answer's prompt and what it generated."""


def continuation(
    endpoint: str, request: dict[str, Any], partial: Partial, chat: bool
) -> Continuation | bytes:
    """What a line that kept `partial` sends next; or, when its token limit was reached as it
    was preempted, its complete answer (compact UTF-8 JSON)."""
    body = continued_body(endpoint, request["body"], partial)
    if body is None:
        return _compact(finished_answer(partial, chat))
    resent = (partial.prompt_tokens or 0) + partial.completion_tokens
    return Continuation({**request, "body": body}, Reassembled(chat, before=partial), resent)


def resume(attempt: LineAttempt, partial: Partial) -> Answer | None:
    """Make `attempt` (streamed) continue `partial`: it sends the continuation, whose stream
    joins the partial answer. When the token limit was reached as the line was preempted, the
    line's complete answer instead (nothing is sent)."""
    assert attempt.stream is not None
    then = continuation(attempt.input.endpoint, attempt.request, partial, attempt.stream.chat)
    if isinstance(then, bytes):
        return attempt.answered(200, "application/json", then)
    attempt.sent, attempt.stream, attempt.resent = then.request, then.stream, then.resent
    return None


def reassembled(stream: Reassembled) -> bytes:
    """The non-streamed answer a complete stream makes, as compact UTF-8 JSON."""
    stream.end()
    if not stream.done:
        raise StreamError("the stream ended before its last event ([DONE])")
    return _compact(stream.answer())


def _compact(answer: dict[str, Any]) -> bytes:
    return json.dumps(answer, separators=(",", ":"), ensure_ascii=False).encode()
