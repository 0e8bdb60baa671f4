"""One run of one batch line (`LineAttempt`): what the line activity, its send, its preemptible
send, its streamed rebuild and its record share.

`activities.lines.run_line` builds one once the line is read and its route known; the send
(`LineActivities._send`), the preemptible send (`activities.preemption.send`) and the continuation
of a preempted line (`activities.lines.streamed.resume`) each take it whole, and the records it
makes (`failed`, `answered`, `preempted`) carry its custom_id, line number and request id.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from activities.lines.answers import Answer, failed, http_answer, unexpected
from backfill.batches.streamed_answer import Reassembled
from backfill.platform.config import RouteConfig
from backfill.platform.messages import LineInput, LineOutcome
from backfill.tenancy.byte_budget import Claim
from backfill.upstream.endpoints import REGISTRY, EndpointSpec


@dataclass
class LineAttempt:
    """One run of one line: read, sent (or held at the door, or preempted), then recorded."""

    input: LineInput
    """The activity's input: the batch, the route, the line's place, its preemptions so far."""
    line_no: int
    """The line's number in the input file (its record's key)."""
    custom_id: str
    request: dict[str, Any]
    """The line's request as read (its model is what the usage journal records)."""
    route: RouteConfig
    rid: str
    """This attempt's `X-Request-ID` (each attempt has its own; its usage entry too)."""
    timeout: float
    """Seconds the whole exchange may take (the workflow sized the activity's timeout from it)."""
    stream: Reassembled | None = None
    """Where a line that goes upstream streamed is put back together (None: it goes as it came)."""
    sent: dict[str, Any] = field(default_factory=dict)
    """The request that goes upstream: the line's own, or the one continuing its partial answer
    (`activities.lines.streamed.resume`)."""
    resent: int = 0
    """Tokens a continuation sends upstream again (the partial answer's prompt and text)."""
    claim: Claim | None = None
    """What the line holds of the worker's buffer budget (its answer grows it as it comes)."""

    spec: EndpointSpec = field(init=False)
    """The line's endpoint (its upstream path, its usage fields)."""

    def __post_init__(self) -> None:
        self.spec = REGISTRY[self.input.endpoint]
        if not self.sent:
            self.sent = self.request

    @property
    def continues(self) -> bool:
        """Whether this attempt continues a partial answer an earlier run kept."""
        return self.sent is not self.request

    def failed(self, code: str, message: str, *, retry: bool = False) -> Answer:
        return failed(self.custom_id, self.line_no, code, message, retry=retry)

    def unexpected(self, err: Exception) -> Answer:
        return unexpected(self.custom_id, self.line_no, err)

    def answered(self, status: int, content_type: str, body: bytes | bytearray) -> Answer:
        """The record of a complete HTTP answer to this attempt."""
        return http_answer(
            self.custom_id, self.line_no, status, self.rid, content_type, body, self.spec
        )

    def held(self) -> Answer:
        """Held at the door: nothing was sent (back to the queue, not a try; decision 0029)."""
        return Answer(b"", LineOutcome(line=self.line_no, preempted=True, held=True))

    def preempted(self, generated: int) -> Answer:
        """Ended for live traffic, having generated `generated` tokens: nothing is committed."""
        outcome = LineOutcome(
            line=self.line_no, error_code="preempted", preempted=True, wasted_tokens=generated
        )
        return Answer(b"", outcome)

    def again(self, status_code: int | None, retry_after: float | None = None) -> LineOutcome:
        """The outcome of an attempt whose line goes back to the queue to be sent again."""
        return LineOutcome(
            line=self.line_no,
            retry=True,
            status_code=status_code,
            retry_after=retry_after,
            reprefill_tokens=self.resent,
        )
