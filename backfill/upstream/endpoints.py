"""The endpoint registry: every inference endpoint backfill knows, in one table.

Each `EndpointSpec` says which body field names the model, which field is the required input
(and its shape), whether the live proxy serves it and whether it may stream, where its usage is
in an answer, and what the simulator answers. From it come the batch endpoint list
(`Endpoint`, `ENDPOINTS`), validation's input-field rule (`backfill.batches.input_rules`), the usage
reader (`backfill.batches.records.usage_of`, `api.live.usage_counts`), the live proxy's routes
(`api.live.proxy`, `api.app.LIVE_PATHS`) and the simulator's routing (`tools.sim.server`).

Adding an endpoint: one entry in `REGISTRY`, its path in `Endpoint` (the Literal keeps the
OpenAPI document typed; the module refuses to import if the two disagree), its tests, and the
simulator's answer body if its `sim_answer` is new.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

Endpoint = Literal["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"]
"""The batch endpoints (`POST /v1/batches` `endpoint`), as a type for the OpenAPI document."""

InputShape = Literal["messages", "text_or_array"]
"""`messages`: a non-empty array; `text_or_array`: a string or an array."""
SimAnswer = Literal["chat", "completion", "embedding", "response"]
"""Which answer body the simulator builds."""


@dataclass(frozen=True)
class UsageFields:
    """Where an answer's `usage` object keeps its token counts."""

    input: str = "prompt_tokens"
    output: str = "completion_tokens"
    cached: tuple[str, str] = ("prompt_tokens_details", "cached_tokens")
    """(details object, field) of the cached input tokens."""
    reasoning: tuple[str, str] = ("completion_tokens_details", "reasoning_tokens")
    """(details object, field) of the reasoning output tokens."""
    in_stream: tuple[str, ...] = ("usage",)
    """The path to the usage object inside a streamed event's JSON (`data:`)."""


CHAT_USAGE = UsageFields()
"""OpenAI's Chat Completions / Completions / Embeddings usage."""
RESPONSES_USAGE = UsageFields(
    input="input_tokens",
    output="output_tokens",
    cached=("input_tokens_details", "cached_tokens"),
    reasoning=("output_tokens_details", "reasoning_tokens"),
    in_stream=("response", "usage"),  # in the `response.completed` event
)
"""The Responses API's usage."""


@dataclass(frozen=True)
class EndpointSpec:
    path: str
    """As in a batch line's `url` and the live request's path, e.g. `/v1/chat/completions`."""
    input_field: str
    """The body field the endpoint requires (validation, the simulator)."""
    input_shape: InputShape
    sim_answer: SimAnswer
    model_field: str = "model"
    """The body field that names the model (routing, access checks)."""
    live: bool = True
    """Whether the live proxy serves it."""
    streams: bool = True
    """Whether a live request may ask for a server-sent event stream (`stream: true`)."""
    usage: UsageFields = CHAT_USAGE

    @property
    def upstream_path(self) -> str:
        """The path under a route's `base_url` (which ends in `/v1`)."""
        return self.path.removeprefix("/v1")


REGISTRY: dict[str, EndpointSpec] = {
    spec.path: spec
    for spec in (
        EndpointSpec("/v1/chat/completions", "messages", "messages", "chat"),
        EndpointSpec("/v1/completions", "prompt", "text_or_array", "completion"),
        EndpointSpec("/v1/embeddings", "input", "text_or_array", "embedding", streams=False),
        EndpointSpec("/v1/responses", "input", "text_or_array", "response", usage=RESPONSES_USAGE),
    )
}
"""Every endpoint, by path."""

ENDPOINTS: tuple[str, ...] = tuple(REGISTRY)
"""Batch endpoints, in registry order."""
LIVE_PATHS: frozenset[str] = frozenset(p for p, spec in REGISTRY.items() if spec.live)
"""Paths the live proxy serves."""
USAGE_FIELDS: tuple[UsageFields, ...] = tuple(dict.fromkeys(s.usage for s in REGISTRY.values()))
"""Each distinct usage layout, for a record whose endpoint is not known."""

if set(get_args(Endpoint)) != set(REGISTRY):
    raise RuntimeError("backfill.upstream.endpoints: the Endpoint Literal and REGISTRY disagree")


def spec_of(path: str) -> EndpointSpec | None:
    return REGISTRY.get(path)
