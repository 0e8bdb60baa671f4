"""Token counts of a live answer, read off the bytes as they are relayed (nothing is changed).

A JSON answer's `usage` is read once the body is complete (bodies over `MAX_JSON_BYTES` are not
kept, and count no tokens); an SSE stream's usage is the last `data:` event that carries one,
which OpenAI-compatible servers send only when the request set
`stream_options.include_usage` (a stream without it counts the request, not its tokens).
"""

from __future__ import annotations

from typing import Any

from backfill import strict_json
from backfill.endpoints import CHAT_USAGE, UsageFields
from backfill.records import usage_of

MAX_JSON_BYTES = 16 * 1024 * 1024
"""Largest JSON answer kept to read its usage."""


class UsageReader:
    """Fed every relayed chunk; `tokens()` is (prompt, completion) at the end."""

    def __init__(self, content_type: str, fields: UsageFields = CHAT_USAGE) -> None:
        self.stream = content_type.startswith("text/event-stream")
        self.fields = fields
        """The endpoint's usage layout (`backfill.endpoints`)."""
        self._buf = bytearray()
        self._too_large = False
        self._usage: Any = None

    def feed(self, chunk: bytes) -> None:
        if self._too_large:
            return
        self._buf += chunk
        if self.stream:
            *lines, rest = bytes(self._buf).split(b"\n")
            self._buf = bytearray(rest)
            for line in lines:
                self._event(line.strip())
        elif len(self._buf) > MAX_JSON_BYTES:
            self._too_large, self._buf = True, bytearray()

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
            self._event(bytes(self._buf).strip())
        elif not self._too_large and self._buf:
            try:
                body = strict_json.loads(self._buf, finite=False)
            except ValueError:
                body = None
            if isinstance(body, dict):
                self._usage = body.get("usage")
        counts = usage_of(self._usage, self.fields)
        return (counts.input_tokens, counts.output_tokens) if counts else (0, 0)
