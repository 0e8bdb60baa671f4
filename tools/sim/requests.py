"""The simulator's requests: a body parsed into what it asks for (`parse_request`), and the reply
text the simulator makes for it, a continuation included (`reply_pieces`).

The reply to a prompt is ``Simulated`` followed by the prompt's words (at most ``REPLY_WORDS``
words unless GPU mode makes it longer, `tools.sim.gpu_reply`); one word is one token. A request
that continues an answer already begun (chat: the final assistant message with
`continue_final_message`; completions: the prompt followed by the beginning of the reply to it)
gets the tokens that follow, as vLLM continues, so a reply continued from any of its prefixes is
the reply uninterrupted.
"""

from __future__ import annotations

import array
import base64
import json
import random
from dataclasses import dataclass
from typing import Any, Protocol

from backfill.upstream.endpoints import EndpointSpec
from tools.sim import responses
from tools.sim.gpu_reply import split_words

CHAT, EMBEDDINGS, RESPONSE = "chat", "embedding", "response"  # `EndpointSpec.sim_answer`
REPLY_WORDS = 16  # default reply length (words == tokens here) unless max_tokens is lower


class BadRequest(Exception):
    pass


@dataclass(slots=True)
class SimRequest:
    kind: str
    model: str
    texts: list[str]  # chat: message contents; completions: prompts; embeddings: inputs
    priority: int
    n: int
    max_tokens: int | None
    stream: bool
    include_usage: bool
    raw: dict[str, Any]
    batch: bool = False
    """Sent with `X-Backfill-Batch` (a batch line), else live."""
    role: str = "assistant"
    """The answer's role: the last message's with `continue_final_message` (as in vLLM)."""


def _texts(value: Any, name: str) -> list[str]:
    """str | list[str] | list[int] | list[list[int]] -> texts (token ids become number words)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value:
        if all(isinstance(v, str) for v in value):
            return list(value)
        if all(isinstance(v, int) for v in value):
            return [" ".join(map(str, value))]
        if all(isinstance(v, list) and all(isinstance(i, int) for i in v) for v in value):
            return [" ".join(map(str, v)) for v in value]
    raise BadRequest(f"'{name}' must be a string, a list of strings or a list of token ids")


def _content(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):  # content parts
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def opt_int(raw: dict[str, Any], name: str, default: int | None, lo: int = 1) -> int | None:
    v = raw.get(name)
    if v is None:
        return default
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise BadRequest(f"'{name}' must be an integer >= {lo}")
    return v


def parse_request(spec: EndpointSpec, body: bytes) -> SimRequest:
    kind = spec.sim_answer
    try:
        raw = json.loads(body)
    except (ValueError, RecursionError) as e:
        raise BadRequest(f"Invalid JSON in request body: {e}") from None
    if not isinstance(raw, dict):
        raise BadRequest("Request body must be a JSON object")
    model, required = raw.get(spec.model_field), spec.input_field
    if not isinstance(model, str) or not model:
        raise BadRequest("Field required: 'model'")
    if raw.get(required) is None:
        raise BadRequest(f"Field required: '{required}'")
    if kind == CHAT:
        msgs = raw["messages"]
        if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) for m in msgs):
            raise BadRequest("'messages' must be a non-empty list of message objects")
        texts = [_content(m) for m in msgs]
        if raw.get("continue_final_message") and raw.get("add_generation_prompt", True):
            raise BadRequest(
                "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
            )
    elif kind == RESPONSE:
        found = responses.input_texts(raw[required])
        if found is None:
            raise BadRequest(f"'{required}' must be a string or a non-empty list of items")
        texts = found
    else:
        texts = _texts(raw[required], required)
    priority = opt_int(raw, "priority", 0, lo=-(2**63))
    max_tokens = (
        opt_int(raw, "max_completion_tokens", None)
        or opt_int(raw, "max_tokens", None)
        or opt_int(raw, "max_output_tokens", None)
    )
    opts = raw.get("stream_options")
    include_usage = isinstance(opts, dict) and bool(opts.get("include_usage"))
    n = opt_int(raw, "n", 1)
    last_role = msgs[-1].get("role") if kind == CHAT else None
    continued = kind == CHAT and bool(raw.get("continue_final_message"))
    return SimRequest(
        kind=kind,
        model=model,
        texts=texts,
        priority=priority or 0,
        n=min(n or 1, 128),
        max_tokens=max_tokens,
        stream=bool(raw.get("stream")),
        include_usage=include_usage,
        raw=raw,
        role=last_role if continued and isinstance(last_role, str) else "assistant",
    )


def reply_words(prefix: str, text: str, limit: int | None) -> tuple[list[str], str]:
    words = [prefix, *split_words(text)][:REPLY_WORDS]
    if limit is not None and limit < len(words):
        return words[:limit], "length"
    return words, "stop"


def pieces(words: list[str]) -> list[str]:
    """A reply's tokens as sent: every word but the first with its leading space."""
    return [w if j == 0 else " " + w for j, w in enumerate(words)]


def _rest(prompt: str, partial: str) -> list[str] | None:
    """The tokens left of the reply to `prompt` once `partial` (its first tokens) is written;
    None when `partial` is not how that reply starts."""
    tokens, done = pieces(reply_words("Simulated", prompt, None)[0]), ""
    for k, piece in enumerate(tokens):
        if done == partial:
            return tokens[k:]
        done += piece
    return [] if done == partial else None


def _continued(req: SimRequest, prompt: str) -> tuple[list[str], str] | None:
    """vLLM-like continuation: the tokens that follow an answer already begun, so a reply
    continued from any of its prefixes is the reply uninterrupted. Chat: the final message
    continued (`continue_final_message`) answers the message before it; completions: a prompt
    that ends with the beginning of the reply to what precedes it (`prompt + partial text`)."""
    if req.kind == CHAT:
        if req.role == "assistant" and req.raw.get("continue_final_message") and len(req.texts) > 1:
            rest = _rest(req.texts[-2], req.texts[-1])
        else:
            return None
    else:
        rest, at = None, prompt.find("Simulated")
        while rest is None and at >= 0:
            rest = _rest(prompt[:at], prompt[at:])
            at = prompt.find("Simulated", at + 1)
    if rest is None:
        return None
    limit = req.max_tokens
    if limit is not None and limit < len(rest):
        return [" " + p.lstrip(" ") for p in rest[:limit]], "length"
    return [" " + p.lstrip(" ") for p in rest], "stop"


def reply_pieces(req: SimRequest, prompt: str) -> tuple[list[str], str]:
    """The reply's tokens as sent (with their spaces) and its finish reason."""
    continued = _continued(req, prompt) if req.n == 1 else None
    if continued is not None:
        return continued
    words, reason = reply_words("Simulated", prompt, req.max_tokens)
    return pieces(words), reason


def _embedding(text: str, dim: int, seed: int) -> list[float]:
    rnd = random.Random(f"{seed}:{text}")
    vec = [rnd.uniform(-1.0, 1.0) for _ in range(dim)]
    norm = sum(v * v for v in vec) ** 0.5 or 1.0
    return [v / norm for v in vec]


class EmbeddingConfig(Protocol):
    """What an embeddings answer reads of the simulator's config (`server.SimConfig` is one)."""

    @property
    def embedding_dim(self) -> int: ...
    @property
    def seed(self) -> int: ...


def embeddings_body(req: SimRequest, prompt_tokens: int, dim: int, seed: int) -> dict[str, Any]:
    """The embeddings answer: one seeded unit vector per input (``dimensions`` or ``dim``)."""
    dim = opt_int(req.raw, "dimensions", dim) or 1
    b64 = req.raw.get("encoding_format") == "base64"
    data = []
    for i, text in enumerate(req.texts):
        vec: Any = _embedding(text, dim, seed)
        if b64:  # the openai SDK's default: raw float32 (native order)
            vec = base64.b64encode(array.array("f", vec).tobytes()).decode()
        data.append({"object": "embedding", "index": i, "embedding": vec})
    usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}
    return {"object": "list", "data": data, "model": req.model, "usage": usage}
