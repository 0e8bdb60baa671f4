"""GPU mode's chat/completions bodies, token by token (pure: dicts and SSE bytes, no I/O).

The reply to a prompt is ``Simulated`` followed by the prompt's words, repeated as long as the
request's token count asks; one word is one token. A request that continues a reply already begun
(`continuation`: chat's final assistant message with `continue_final_message`, or a completions
prompt followed by the beginning of its reply, decision 0036) gets the tokens that follow it, so
a reply continued from any of its prefixes is the reply uninterrupted, as vLLM's continuation of
a greedy answer is. Words are split at ASCII whitespace only, so a
prompt's U+2028 or U+0085 comes back in the answer, as a real model's can; bodies are UTF-8 JSON
with non-ASCII characters unescaped, as vLLM sends them.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

_ASCII_SPACE = re.compile(r"[ \t\n\r\f\v]+")


def split_words(text: str) -> list[str]:
    """The words of a prompt (one a token): split at ASCII whitespace only."""
    return [w for w in _ASCII_SPACE.split(text) if w]


def dumps(obj: Any) -> bytes:
    """Compact UTF-8 JSON, non-ASCII unescaped (like vLLM's bodies)."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def continued_at(prompt: str, partial: str) -> int | None:
    """How many tokens of the reply to ``prompt`` ``partial`` is (None: not how it starts)."""
    words = ["Simulated", *split_words(prompt)]
    done, k = "", 0
    while len(done) < len(partial):
        done += words[k % len(words)] if k == 0 else " " + words[k % len(words)]
        k += 1
    return k if done == partial else None


def continuation(
    chat: bool, texts: list[str], continue_final: bool, role: str
) -> tuple[str, int] | None:
    """(the prompt a continued reply answers, the tokens of it already written), or None when
    the request starts a new reply. Chat: the final message continued (``continue_final``, role
    assistant) answers the message before it; completions: a prompt that ends with the
    beginning of the reply to what precedes it."""
    if chat:
        if not (continue_final and role == "assistant" and len(texts) > 1):
            return None
        k = continued_at(texts[-2], texts[-1])
        return None if k is None else (texts[-2], k)
    if len(texts) != 1:
        return None
    prompt = texts[0]
    at = prompt.find("Simulated")
    while at >= 0:
        k = continued_at(prompt[:at], prompt[at:])
        if k is not None:
            return prompt[:at], k
        at = prompt.find("Simulated", at + 1)
    return None


@dataclass
class GpuReply:
    chat: bool
    stream: bool
    model: str
    prompts: list[str]
    """The prompt each choice answers (chat: the last message), already repeated for ``n``."""
    reason: str
    """``length`` when the request set a token limit, else ``stop``."""
    offset: int = 0
    """Tokens of each reply already written (a continuation): token ``j`` sent is the reply's
    ``offset + j``."""
    usage_so_far: int | None = None
    """vLLM's ``continuous_usage_stats``: the prompt's tokens, and every event carries the
    counts so far (None: not asked for)."""
    head: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        kind = (
            ("chat.completion.chunk" if self.stream else "chat.completion") if self.chat else None
        )
        self.head = {
            "id": f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex}",
            "object": kind or "text_completion",
            "created": int(time.time()),
            "model": self.model,
        }
        self._words = [["Simulated", *split_words(p)] for p in self.prompts]

    def piece(self, choice: int, j: int) -> str:
        """Token ``j`` of a choice, with its leading space."""
        words, j = self._words[choice], j + self.offset
        return words[j % len(words)] if j == 0 else " " + words[j % len(words)]

    def words(self, tokens: int) -> list[str]:
        """The first choice's first ``tokens`` tokens, as words (the prefix cache's names)."""
        return [self.piece(0, j).lstrip(" ") for j in range(tokens)]

    def _choice(self, i: int, text: str | None, finish: str | None, role: bool) -> dict:
        if self.chat:
            delta: dict[str, Any] = {} if text is None else {"content": text}
            if role:
                delta["role"] = "assistant"
            c: dict[str, Any] = {"index": i, "delta": delta}
        else:
            c = {"index": i, "text": text or ""}
        return {**c, "logprobs": None, "finish_reason": finish}

    def _event(self, choices: list[dict[str, Any]], usage: Any = None, sent: int = 0) -> bytes:
        obj = {**self.head, "choices": choices}
        if usage is None and self.usage_so_far is not None and choices:
            prompt = self.usage_so_far
            usage = {"prompt_tokens": prompt, "completion_tokens": sent}
            usage["total_tokens"] = prompt + sent
        if usage is not None:
            obj["usage"] = usage
        return b"data: " + dumps(obj) + b"\n\n"

    def token_events(self, j: int) -> bytes:
        """The SSE events carrying token ``j`` of every choice."""
        n = len(self.prompts)
        return b"".join(
            self._event([self._choice(i, self.piece(i, j), None, role=j == 0)], sent=j * n + i + 1)
            for i in range(n)
        )

    def tail_events(self, usage: dict[str, int] | None) -> bytes:
        """Finish reasons, the usage chunk (when asked for) and ``[DONE]``."""
        sent = usage["completion_tokens"] if usage is not None else 0
        tail = [
            self._event([self._choice(i, None, self.reason, False)], sent=sent)
            for i in range(len(self.prompts))
        ]
        if usage is not None:
            tail.append(self._event([], usage))
        return b"".join(tail) + b"data: [DONE]\n\n"

    def body(self, tokens: int, usage: dict[str, int]) -> dict[str, Any]:
        """The non-streaming response after ``tokens`` tokens per choice."""
        out = []
        for i in range(len(self.prompts)):
            text = "".join(self.piece(i, k) for k in range(tokens))
            part: dict[str, Any] = (
                {"message": {"role": "assistant", "content": text}} if self.chat else {"text": text}
            )
            out.append({"index": i, **part, "finish_reason": self.reason, "logprobs": None})
        return {**self.head, "choices": out, "usage": usage}
