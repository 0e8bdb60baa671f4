"""Token counts of a live answer, read off the bytes as they are relayed (nothing is changed).

A JSON answer's `usage` is read once the body is complete (bodies over `MAX_JSON_BYTES` are not
kept, and count no tokens); an SSE stream's usage is the last `data:` event that carries one,
which OpenAI-compatible servers send only when the request set
`stream_options.include_usage` (a stream without it counts the request, not its tokens).

What is kept draws on the api process's usage budget (`Settings.api_usage_buffer_bytes`, a
share per workspace; `backfill.tenancy.byte_budget`): an answer (or an event) that does not fit is
not kept and counts no tokens, as one over the cap. The relay never waits on it: the client gets
every byte either way.
"""

from __future__ import annotations

from typing import Any

from backfill.batches.records import usage_of
from backfill.platform import strict_json
from backfill.tenancy.byte_budget import Claim
from backfill.upstream.endpoints import CHAT_USAGE, UsageFields

MAX_JSON_BYTES = 16 * 1024 * 1024
"""Largest JSON answer kept to read its usage."""
DECODED_COPIES = 3
"""What decoding a kept answer for its usage may take, in its size (a float is a 24-byte object
and an 8-byte pointer for about 10 bytes of text). One at a time: it runs on the event loop."""
MAX_EVENT_BYTES = 16 * 1024 * 1024
"""Longest SSE line kept to read its usage (a Responses API `response.completed` event carries
the whole response); a longer one is passed over up to its newline, and counts no tokens."""


class UsageReader:
    """Fed every relayed chunk; `tokens()` is (prompt, completion) at the end."""

    def __init__(
        self, content_type: str, fields: UsageFields = CHAT_USAGE, claim: Claim | None = None
    ) -> None:
        self.stream = content_type.startswith("text/event-stream")
        self.fields = fields
        """The endpoint's usage layout (`backfill.upstream.endpoints`)."""
        self.claim = claim
        """What the kept bytes hold of the process's usage budget (None: no budget); given
        back by `tokens()`."""
        self._buf = bytearray()
        """JSON: the body so far; SSE: the line not yet ended (only that, at most
        `MAX_EVENT_BYTES`)."""
        self._too_large = False
        """JSON: the body is over its cap; SSE: the current line is (passed over to its end)."""
        self._usage: Any = None

    def feed(self, chunk: bytes) -> None:
        if self.stream:
            self._feed_stream(chunk)
            return
        if self._too_large:
            return
        size = len(self._buf) + len(chunk)
        if size > MAX_JSON_BYTES or not self._hold(size):
            self._too_large, self._buf = True, bytearray()
            self._hold(0)
            return
        self._buf += chunk

    def _hold(self, size: int) -> bool:
        """Whether the budget lets `size` bytes be kept (they are claimed if so)."""
        return self.claim is None or self.claim.resize(size)

    def _feed_stream(self, chunk: bytes) -> None:
        """Each line is looked at once, when its newline arrives: the bytes already held are
        never copied again per chunk, and an unended line holds at most `MAX_EVENT_BYTES`."""
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            if self._too_large or len(self._buf) + end - start > MAX_EVENT_BYTES:
                self._too_large = False  # the end of a line over the cap: dropped
                self._buf.clear()
            elif self._buf:
                self._buf += chunk[start:end]
                self._event(bytes(self._buf).strip())
                self._buf.clear()
            else:
                self._event(chunk[start:end].strip())
            start = end + 1
        if self._too_large or start == len(chunk):
            self._hold(len(self._buf))
            return
        size = len(self._buf) + len(chunk) - start
        if size > MAX_EVENT_BYTES or not self._hold(size):
            self._too_large = True
            self._buf.clear()
            self._hold(0)
        else:
            self._buf += chunk[start:]

    def _event(self, line: bytes) -> None:
        if not line.startswith(b"data:") or b'"usage"' not in line:
            return
        try:
            event = strict_json.loads(line[5:].strip(), finite=False)
        except ValueError:
            return
        for key in self.fields.in_stream:  # e.g. `usage`, or `response` then `usage`
            event = event.get(key) if isinstance(event, dict) else None
        if isinstance(event, dict):
            self._usage = event

    def tokens(self) -> tuple[int, int]:
        if self.stream:
            if not self._too_large:
                self._event(bytes(self._buf).strip())
        elif not self._too_large and self._buf:
            try:
                body = strict_json.loads(self._buf, finite=False)
            except ValueError:
                body = None
            if isinstance(body, dict):
                self._usage = body.get("usage")
        self._buf = bytearray()
        self._hold(0)
        counts = usage_of(self._usage, self.fields)
        return (counts.input_tokens, counts.output_tokens) if counts else (0, 0)
