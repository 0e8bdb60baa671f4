"""A batch line sent upstream streamed, and its answer put back together (pure: no I/O).

A line that may be preempted goes upstream with `stream: true` and `stream_options.include_usage`
(decision 0036): what it has generated is then known token by token, so a preempted line can keep
its partial answer. Its record must still be the answer the line asked for, a non-streamed one:
`Reassembled` turns the events back into that object, in the line's own shape:

- `id`, `created`, `model` (and `system_fingerprint`, `service_tier` when sent) of the first
  event, `object` `chat.completion` or `text_completion`;
- one choice: the text joined (chat: `message` with the first `role` sent and every string field
  of the deltas joined, e.g. `content`, `reasoning_content`; completions: `text`), `logprobs`
  null, the last `finish_reason` (and vLLM's `stop_reason` when sent);
- the `usage` of the last event that carried one.

Only lines whose answer is exactly that object are streamed (`streamable`): one choice, no log
probabilities, no tool or function calls, no structured output, no echo. The others go upstream
as they came, and restart when preempted.

A streamed line that is preempted keeps what it generated (`Partial`, in the store); its next
run continues it (`continued_body`: chat appends the partial assistant message with
`continue_final_message`, completions append the text to the prompt, both lower the token
limits by what was generated), and `Reassembled(before=partial)` joins the segments into one
answer: the first segment's `id`, `created` and `model`, the texts joined, and the usage rule
of `joined_usage`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel

from backfill.platform import strict_json

STREAMED_ENDPOINTS = frozenset({"/v1/chat/completions", "/v1/completions"})
"""Endpoints whose lines may go upstream streamed (embeddings have nothing to stream; the
Responses API's shape is not rebuilt)."""
RESTART_FIELDS = (
    "logprobs",
    "top_logprobs",
    "prompt_logprobs",
    "tools",
    "tool_choice",
    "functions",
    "function_call",
    "response_format",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "guided_decoding_backend",
    "structured_outputs",
    "echo",
    "best_of",
    "suffix",
    "stream_options",
)
"""Body fields (when set to anything but their defaults: null, false, empty, and 1 for `best_of`,
0 for `top_logprobs`) that keep a line out of streaming and
resuming: its answer carries more than text (log probabilities, tool calls), or a continuation
would not be the same answer (a grammar restarted mid-way, an echoed or suffixed prompt)."""
MAX_EVENT_BYTES = 1024 * 1024
"""Longest SSE line read; a longer one is not an event of a chat or completion stream."""


class StreamError(ValueError):
    """The stream is not one that can be put back together (an error event, an odd event)."""


_DEFAULTS: dict[str, object] = {"best_of": 1, "top_logprobs": 0}


def _set(name: str, value: Any) -> bool:
    if value is None or value is False or value in ([], {}, ""):
        return False
    return name not in _DEFAULTS or value != _DEFAULTS[name] or isinstance(value, bool)


def streamable(endpoint: str, body: dict[str, Any]) -> bool:
    """Whether a line with this body may go upstream streamed and be resumed (see the module)."""
    if endpoint not in STREAMED_ENDPOINTS:
        return False
    n = body.get("n")
    if n is not None and n != 1:
        return False
    if endpoint == "/v1/completions" and not isinstance(body.get("prompt"), str):
        return False  # token ids or several prompts: several choices, or no text to append
    if endpoint == "/v1/chat/completions" and body.get("continue_final_message"):
        messages = body.get("messages")
        last = messages[-1] if isinstance(messages, list) and messages else None
        if not isinstance(last, dict) or not isinstance(last.get("content"), str):
            return False  # the partial text is appended to that message's text
    return not any(_set(name, body.get(name)) for name in RESTART_FIELDS)


def streamed_body(body: dict[str, Any]) -> dict[str, Any]:
    """`body` asking for a stream with the usage in its last event, and in every event where the
    server can (vLLM's and SGLang's `continuous_usage_stats`: what a preempted line generated,
    and its prompt's size, are then exact)."""
    options = {"include_usage": True, "continuous_usage_stats": True}
    return {**body, "stream": True, "stream_options": options}


TOKEN_LIMITS = ("max_tokens", "max_completion_tokens")
"""The body fields that bound an answer's tokens (lowered for a continuation)."""


class Partial(BaseModel):
    """What a preempted line generated so far, kept in the store between its runs."""

    head: dict[str, Any]
    """The first segment's `id`, `created`, `model` (and fingerprint, tier): the answer's."""
    role: str = "assistant"
    text: str
    """The answer's text so far (chat: the message's `content`; completions: `text`)."""
    completion_tokens: int
    """Tokens generated so far, every segment's (each counted by the server where it said)."""
    prompt_tokens: int | None = None
    """The first request's prompt tokens, when the server said (None: not known yet)."""
    segments: int = 1
    """Requests whose text this holds."""


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def continued_body(endpoint: str, body: dict[str, Any], partial: Partial) -> dict[str, Any] | None:
    """The body that continues `partial`; None when its token limit is already reached (the
    answer is complete: `finished_answer`)."""
    out = dict(body)
    for name in TOKEN_LIMITS:
        limit = _int(body.get(name))
        if limit is not None:
            if limit - partial.completion_tokens <= 0:
                return None
            out[name] = limit - partial.completion_tokens
    least = _int(body.get("min_tokens"))  # vLLM's
    if least is not None:
        out["min_tokens"] = max(0, least - partial.completion_tokens)
    if endpoint != "/v1/chat/completions":
        out["prompt"] = body["prompt"] + partial.text
        return out
    messages = list(body["messages"])
    if body.get("continue_final_message"):
        last = messages[-1]
        messages[-1] = {**last, "content": last["content"] + partial.text}
    else:
        messages.append({"role": partial.role, "content": partial.text})
    out.update(messages=messages, continue_final_message=True, add_generation_prompt=False)
    return out


def joined_usage(
    partial: Partial, last: dict[str, Any] | None, completion: int
) -> dict[str, int] | None:
    """The usage of an answer made of several segments: the prompt tokens of the first request
    (a continuation's prompt also holds the text already generated; the user is not billed for
    it again) and the completion tokens of every segment. `last` is the last segment's usage,
    `completion` its completion tokens. When the first prompt's size is not known, it is the last
    prompt's less the tokens generated before it."""
    prompt = partial.prompt_tokens
    if prompt is None:
        last_prompt = _int(last.get("prompt_tokens")) if last else None
        if last_prompt is None:
            return None
        prompt = max(0, last_prompt - partial.completion_tokens)
    total = partial.completion_tokens + completion
    return {"prompt_tokens": prompt, "completion_tokens": total, "total_tokens": prompt + total}


def finished_answer(partial: Partial, chat: bool) -> dict[str, Any]:
    """The answer of a line preempted once its token limit was reached."""
    stream = Reassembled(chat, before=partial)
    stream.finish_reason = "length"
    stream.head = dict(partial.head)
    return stream.answer()


class SseLines:
    """The lines of an SSE byte stream, fed chunk by chunk (`feed` yields each complete line)."""

    def __init__(self, max_line: int = MAX_EVENT_BYTES) -> None:
        self._buf = bytearray()
        self._max = max_line

    def feed(self, chunk: bytes) -> Iterator[bytes]:
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            if self._buf:
                self._buf += chunk[start:end]
                line = bytes(self._buf)
                self._buf.clear()
            else:
                line = chunk[start:end]
            yield line.rstrip(b"\r")
            start = end + 1
        self._buf += chunk[start:]
        if len(self._buf) > self._max:
            raise StreamError(f"an event line longer than {self._max} bytes")

    def rest(self) -> bytes:
        """The unended last line (a stream should end with a newline)."""
        return bytes(self._buf).rstrip(b"\r")


class Reassembled:
    """A chat or completion stream's events, put back into the non-streamed answer."""

    def __init__(self, chat: bool, before: Partial | None = None) -> None:
        self.chat = chat
        self.before = before
        """What earlier runs of the line generated: this stream continues it."""
        self.head: dict[str, Any] | None = None
        """`id`, `created`, `model` (and fingerprint, tier) of the first event."""
        self.role: str | None = None
        self.fields: dict[str, list[str]] = {}
        """Chat: each string field of the deltas, its pieces (`content` first)."""
        self.others: dict[str, Any] = {}
        """Chat: the deltas' other non-null fields, last value."""
        self.finish_reason: str | None = None
        self.stop_reason: Any = None
        self.saw_stop_reason = False
        self.usage: dict[str, Any] | None = None
        self.pieces = 0
        """Events that carried text: about the tokens generated so far (a server may merge
        tokens into one event; the usage counts exactly at the end)."""
        self.chars = 0
        self.done = False
        self._lines = SseLines()

    def feed(self, chunk: bytes) -> None:
        for line in self._lines.feed(chunk):
            self._line(line)

    def end(self) -> None:
        rest = self._lines.rest()
        if rest:
            self._line(rest)

    def _line(self, line: bytes) -> None:
        if not line.startswith(b"data:"):
            return  # comments, `event:`, blank separators
        data = line[5:].strip()
        if data == b"[DONE]":
            self.done = True
            return
        try:
            event = strict_json.loads(data, finite=False)
        except ValueError as err:
            raise StreamError(f"an event that is not JSON: {strict_json.describe(err)}") from None
        if not isinstance(event, dict):
            raise StreamError("an event that is not a JSON object")
        self.event(event)

    def event(self, event: dict[str, Any]) -> None:
        if "error" in event and "choices" not in event:
            err = event["error"]
            msg = err.get("message") if isinstance(err, dict) else err
            raise StreamError(f"the upstream sent an error mid-stream: {msg}")
        if self.head is None:
            self.head = {k: event[k] for k in ("id", "created", "model") if k in event}
            for k in ("system_fingerprint", "service_tier"):
                if event.get(k) is not None:
                    self.head[k] = event[k]
        usage = event.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        choices = event.get("choices")
        if not isinstance(choices, list):
            return
        for choice in choices:
            if not isinstance(choice, dict):
                raise StreamError("a choice that is not an object")
            if choice.get("index", 0) != 0:
                raise StreamError("more than one choice")
            self._choice(choice)

    def _choice(self, choice: dict[str, Any]) -> None:
        if choice.get("logprobs") is not None:
            raise StreamError("log probabilities in the stream")
        if self.chat:
            delta = choice.get("delta")
            if isinstance(delta, dict):
                self._delta(delta)
        else:
            self._text("text", choice.get("text"))
        if choice.get("finish_reason") is not None:
            self.finish_reason = choice["finish_reason"]
        if "stop_reason" in choice:
            self.saw_stop_reason = True
            if choice["stop_reason"] is not None or self.stop_reason is None:
                self.stop_reason = choice["stop_reason"]

    def _delta(self, delta: dict[str, Any]) -> None:
        for key, value in delta.items():
            if key == "role":
                if self.role is None and isinstance(value, str):
                    self.role = value
            elif isinstance(value, str):
                self._text(key, value)
            elif key in ("tool_calls", "function_call") and value:
                raise StreamError("tool calls in the stream")
            elif value is not None and value != []:
                self.others[key] = value

    def _text(self, key: str, value: Any) -> None:
        if not isinstance(value, str) or not value:
            return
        self.fields.setdefault(key, []).append(value)
        if key in ("content", "text"):
            self.pieces += 1
        self.chars += len(value)

    def text(self) -> str:
        """This stream's text so far (chat: `content`; completions: `text`)."""
        return "".join(self.fields.get("content" if self.chat else "text", ()))

    def generated(self) -> int:
        """Tokens this stream generated so far: the server's count where it sends one in every
        event, else the events that carried text."""
        counted = _int(self.usage.get("completion_tokens")) if self.usage else None
        return counted if counted is not None else self.pieces

    def partial(self) -> Partial | None:
        """What the line has generated, this stream included, to continue from; None when
        nothing new is worth keeping or it cannot be continued faithfully (text other than the
        content, e.g. reasoning: its next run restarts, or continues what was kept before)."""
        text = self.text()
        if self.head is None or not text or set(self.fields) - {"content", "text"} or self.others:
            return None
        before = self.before
        prompt = _int(self.usage.get("prompt_tokens")) if self.usage else None
        if before is None:
            return Partial(
                head=self.head,
                role=self.role or "assistant",
                text=text,
                completion_tokens=self.generated(),
                prompt_tokens=prompt,
            )
        first_prompt = before.prompt_tokens
        return before.model_copy(
            update={
                "text": before.text + text,
                "completion_tokens": before.completion_tokens + self.generated(),
                "prompt_tokens": first_prompt,
                "segments": before.segments + 1,
            }
        )

    def answer(self) -> dict[str, Any]:
        """The non-streamed answer the events make."""
        if self.head is None:
            raise StreamError("a stream without a single event")
        before = self.before
        head = self.head if before is None else before.head
        role = self.role if before is None else before.role
        choice: dict[str, Any] = {"index": 0}
        text = self.text() if before is None else before.text + self.text()
        if self.chat:
            message: dict[str, Any] = {"role": role or "assistant", "content": None}
            for key, pieces in self.fields.items():
                message[key] = "".join(pieces)
            if text or before is not None:
                message["content"] = text
            message.update(self.others)
            choice["message"] = message
        else:
            choice["text"] = text
        choice["logprobs"] = None
        choice["finish_reason"] = self.finish_reason
        if self.saw_stop_reason:
            choice["stop_reason"] = self.stop_reason
        out: dict[str, Any] = {
            "id": head.get("id"),
            "object": "chat.completion" if self.chat else "text_completion",
            "created": head.get("created"),
            "model": head.get("model"),
            "choices": [choice],
        }
        for k in ("system_fingerprint", "service_tier"):
            if k in head:
                out[k] = head[k]
        if before is not None:
            usage = joined_usage(before, self.usage, self.generated())
            if usage is not None:
                out["usage"] = usage
        elif self.usage is not None:
            out["usage"] = self.usage
        return out
