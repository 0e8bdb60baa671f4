"""A batch line's send that gives its seat back to live traffic (decision 0023).

The line waits at its worker's board's door for a seat beside live traffic, then goes upstream;
when the board preempts it, the upstream request is closed (the server aborts it) and the line
ends `preempted`. The board is `activities.preemption.board.PreemptBoard`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from activities.lines.answers import Answer
from activities.lines.attempt import LineAttempt
from activities.preemption.board import PreemptBoard


async def send_preemptible(
    board: PreemptBoard, attempt: LineAttempt, send: Coroutine[Any, Any, Answer]
) -> Answer:
    """`send` (the attempt's exchange) unless live traffic needs the seat first: then the
    upstream request is closed (the server aborts it) and the answer says `preempted`, with the
    tokens it generated (its stream's count, else an estimate). An answer that is complete when
    the preemption comes is kept (it is committed like any other)."""
    stream = attempt.stream
    ticket = board.enter(attempt.input.route_id, attempt.input.preemptions)
    try:
        try:
            may_send = await board.door(ticket)
        except BaseException:
            send.close()  # never sent: cancelled while it waited for a seat
            raise
        if not may_send:  # no seat within the door's limit: back to the queue, not a try
            send.close()
            return attempt.held()
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
        return attempt.preempted(generated)
    finally:
        board.leave(ticket)
