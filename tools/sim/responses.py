"""The simulator's `/v1/responses` answers (pure: dicts and SSE bytes, no I/O).

A Response object shaped like openai-python's `openai.types.responses.Response` (one assistant
message with one `output_text` part), and the Responses API's server-sent events for a stream, in
the order OpenAI and vLLM send them (the SDK's `client.responses.stream()` helper needs each item
and part announced before its text): `response.created`, `response.in_progress`,
`response.output_item.added`, `response.content_part.added`, one `response.output_text.delta` per
word, `response.output_text.done`, `response.content_part.done`, `response.output_item.done`,
`response.completed` (which carries the usage).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from tools.sim.gpu_reply import dumps


def input_texts(value: Any) -> list[str] | None:
    """The texts of a Responses `input`: a string, or a list of message items (`content` a
    string or a list of parts with `text`); None when it is neither."""
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, dict) for v in value):
        return None
    texts = []
    for item in value:
        content = item.get("content")
        if isinstance(content, list):
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        texts.append(content if isinstance(content, str) else "")
    return texts


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt_tokens + completion_tokens,
    }


class ResponseReply:
    """One response to `words`, whole or as events."""

    def __init__(self, model: str, words: list[str], reason: str) -> None:
        self.id = f"resp_{uuid.uuid4().hex}"
        self.item_id = f"msg_{uuid.uuid4().hex}"
        self.model, self.words, self.reason = model, words, reason
        self.created_at = int(time.time())
        self._seq = 0

    def part(self, text: str) -> dict[str, Any]:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def message(self, *, done: bool) -> dict[str, Any]:
        return {
            "id": self.item_id,
            "type": "message",
            "role": "assistant",
            "status": "completed" if done else "in_progress",
            "content": [self.part(" ".join(self.words))] if done else [],
        }

    def body(self, usage: dict[str, Any] | None, *, done: bool = True) -> dict[str, Any]:
        message = self.message(done=True)
        incomplete = done and self.reason == "length"
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": ("incomplete" if incomplete else "completed") if done else "in_progress",
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "model": self.model,
            "output": [message] if done else [],
            "parallel_tool_calls": False,
            "tool_choice": "auto",
            "tools": [],
            "error": None,
            "usage": usage,
        }

    def _event(self, kind: str, **fields: Any) -> bytes:
        event = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + dumps(event) + b"\n\n"

    def created(self) -> bytes:
        """Every event before the first delta: the response, its message item, its text part."""
        where = {"item_id": self.item_id, "output_index": 0, "content_index": 0}
        return b"".join(
            (
                self._event("response.created", response=self.body(None, done=False)),
                self._event("response.in_progress", response=self.body(None, done=False)),
                self._event(
                    "response.output_item.added", output_index=0, item=self.message(done=False)
                ),
                self._event("response.content_part.added", **where, part=self.part("")),
            )
        )

    def delta(self, j: int) -> bytes:
        piece = self.words[j] if j == 0 else " " + self.words[j]
        return self._event(
            "response.output_text.delta",
            item_id=self.item_id,
            output_index=0,
            content_index=0,
            delta=piece,
            logprobs=[],
        )

    def completed(self, usage: dict[str, Any]) -> bytes:
        """Every event after the last delta: the text, its part and item done, the response."""
        where = {"item_id": self.item_id, "output_index": 0, "content_index": 0}
        text = " ".join(self.words)
        return b"".join(
            (
                self._event("response.output_text.done", **where, text=text, logprobs=[]),
                self._event("response.content_part.done", **where, part=self.part(text)),
                self._event(
                    "response.output_item.done", output_index=0, item=self.message(done=True)
                ),
                self._event("response.completed", response=self.body(usage)),
            )
        )
