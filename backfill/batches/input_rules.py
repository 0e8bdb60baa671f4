"""Validation of a batch input file (JSONL), streamed once, plus the batch's line index.

Pure code (no Temporal import): the validation activity opens the stored input file, calls
`validate_input` and, when the outcome has no errors, writes the index with
`FileStore.write_index(batch_id, outcome.offsets, outcome.lengths, outcome.routes,
outcome.route_line_numbers)`.

The file is read in chunks and split on b"\\n" (`backfill.batches.input_lines`); no line is buffered
beyond `limits.max_line_bytes` (+1 byte for a trailing \\r): longer lines are skipped up to the next
newline and reported as `line_too_large`. Lines that are empty or whitespace-only are neither
requests nor errors. Every other physical line is a request line: the request-line count is what
`limits.max_lines_per_batch` bounds, and request lines are numbered from 0 in the index. A UTF-8
byte order mark at the very start of the file is ignored (the index points past it).
"""

from __future__ import annotations

import json
from array import array
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from backfill.batches.batch import BatchError
from backfill.batches.input_lines import SeenIds, iter_lines
from backfill.batches.prefix_order import PrefixKeys, prefix_key, prompt_text
from backfill.files import RouteLines
from backfill.platform import strict_json
from backfill.platform.config import ModelConfig, Settings
from backfill.routes.routing import choose_route
from backfill.upstream.body_policy import refusal_message, refused_field
from backfill.upstream.endpoints import ENDPOINTS, REGISTRY

MAX_CUSTOM_ID_CHARS = 512
"""OpenAI's limit on a batch line's custom_id."""


_BOM = b"\xef\xbb\xbf"


@dataclass
class ValidationOutcome:
    """What `validate_input` found. The index fields are filled only when `errors` is empty."""

    errors: list[BatchError] = field(default_factory=list)
    """Why the file is invalid (at most `max_errors` entries); empty when it is valid."""
    offsets: array = field(default_factory=lambda: array("Q"))
    """array("Q"): byte offset in the file of each request line, in file order."""
    lengths: array = field(default_factory=lambda: array("I"))
    """array("I"): byte length of each request line, without its \\n or \\r\\n."""
    routes: list[RouteLines] = field(default_factory=list)
    """One entry per (model, route) used, in first-seen order, with its line count."""
    route_line_numbers: list[array] = field(default_factory=list)
    """array("I") per entry of `routes`: the request-line numbers (0-based indexes into
    `offsets`) routed there, ascending."""
    models: list[str] = field(default_factory=list)
    """The distinct models the file uses, in first-seen order."""
    prefix_keys: PrefixKeys = field(default_factory=PrefixKeys)
    """Each request line's prompt prefix key (`backfill.batches.prefix_order`), by line number;
    empty when `limits.order_lines_by_prefix` is off."""


def _show(value: object, limit: int = 80) -> str:
    """A short, quoted rendering of a client-supplied value for an error message."""
    text = value if isinstance(value, str) else json.dumps(value)
    if len(text) > limit:
        text = text[:limit] + "..."
    return f"'{text}'"


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _truthy(value: object) -> bool:
    """Whether a model server could read `value` as "yes" (true, 1, "true", "yes", [0], ...).
    Only absent, null, false, 0 and the empty string are "no"."""
    return value not in (None, False, 0, "")


CheckedLine = tuple[str, ModelConfig, str, dict[str, Any]]
"""A line that passed the checks: (model id, its config, custom_id, body)."""


class _LineChecker:
    """The per-line checks, in order: JSON object, custom_id, duplicate, method, url, body,
    model. Returns the first error, or (model id, model config, custom_id)."""

    def __init__(
        self, endpoint: str, settings: Settings, allowed_models: frozenset[str] | None
    ) -> None:
        self.endpoint = endpoint
        self.spec = REGISTRY[endpoint]
        self.required = self.spec.input_field
        self.models = {m.id: m for m in settings.models}
        self.allowed = allowed_models
        self.seen = SeenIds()
        """The custom_ids so far, as 16-byte hashes in flat arrays (not one Python object per
        line: a dict of them took about 130 bytes a line, 26 MB at 200,000 lines)."""

    def check(self, raw: bytes, lineno: int) -> BatchError | CheckedLine:
        try:
            obj = strict_json.loads(raw, unique_keys=True)
        except strict_json.TooDeep as e:
            return BatchError(
                code="invalid_json_line",
                line=lineno,
                message=f"This line is not accepted: it nests arrays and objects more than "
                f"{e.limit} levels deep.",
            )
        except UnicodeDecodeError as e:
            return BatchError(
                code="invalid_json_line",
                line=lineno,
                message=f"This line is not valid UTF-8 (invalid byte at position {e.start}); "
                "batch input files must be UTF-8 encoded JSONL.",
            )
        except ValueError as e:
            return BatchError(
                code="invalid_json_line",
                line=lineno,
                message=f"This line is not valid JSON: {strict_json.describe(e)}.",
            )
        if not isinstance(obj, dict):
            return BatchError(
                code="invalid_json_line",
                line=lineno,
                message=f"This line is {_type_name(obj)}; each line must be a JSON object.",
            )

        custom_id = obj.get("custom_id")
        if not isinstance(custom_id, str) or not custom_id:
            what = "missing" if custom_id is None else _type_name(custom_id)
            if custom_id == "":
                what = "empty"
            return BatchError(
                code="missing_custom_id",
                line=lineno,
                param="custom_id",
                message=f"custom_id must be a non-empty string (it is {what}).",
            )
        if len(custom_id) > MAX_CUSTOM_ID_CHARS:
            return BatchError(
                code="invalid_custom_id",
                line=lineno,
                param="custom_id",
                message=f"custom_id must be at most {MAX_CUSTOM_ID_CHARS} characters "
                f"(it has {len(custom_id)}).",
            )
        first = self.seen.add(custom_id, lineno)
        if first is not None:
            return BatchError(
                code="duplicate_custom_id",
                line=lineno,
                param="custom_id",
                message=f"The custom_id {_show(custom_id)} is already used on line {first}; "
                "custom_id values must be unique within a batch.",
            )

        method = obj.get("method")
        if method != "POST":
            shown = "missing" if method is None else _show(method)
            return BatchError(
                code="invalid_method",
                line=lineno,
                param="method",
                message=f"The method must be 'POST' (it is {shown}).",
            )

        url = obj.get("url")
        if url != self.endpoint:
            message = (
                f"The url is missing; it must match the batch endpoint '{self.endpoint}'."
                if url is None
                else f"The provided url {_show(url)} does not match the batch endpoint "
                f"'{self.endpoint}'. All requests in a batch must use the batch's endpoint."
            )
            return BatchError(code="url_mismatch", line=lineno, param="url", message=message)

        body = obj.get("body")
        if not isinstance(body, dict):
            return BatchError(
                code="invalid_body",
                line=lineno,
                param="body",
                message=f"body must be a JSON object (it is {_type_name(body)})."
                if body is not None
                else "body is missing; it must be a JSON object.",
            )
        field = self.spec.model_field
        model = body.get(field)
        if not isinstance(model, str):
            return BatchError(
                code="invalid_body",
                line=lineno,
                param=f"body.{field}",
                message=f"body.{field} is missing; it must be a string."
                if model is None
                else f"body.{field} must be a string (it is {_type_name(model)}).",
            )
        problem = self._required_field_problem(body)
        if problem is not None:
            return BatchError(
                code="invalid_body",
                line=lineno,
                param=f"body.{self.required}",
                message=problem,
            )
        if _truthy(body.get("stream")):
            return BatchError(
                code="invalid_body",
                line=lineno,
                param="body.stream",
                message=f"body.stream must be false or absent (it is {_show(body['stream'])}): "
                "batch requests cannot stream.",
            )

        config = self.models.get(model)
        if config is None or (self.allowed is not None and model not in self.allowed):
            return BatchError(
                code="unknown_model",
                line=lineno,
                param=f"body.{self.spec.model_field}",
                message=f"The model {_show(model)} does not exist or you do not have access to it.",
            )
        return model, config, custom_id, body

    def _required_field_problem(self, body: dict[str, object]) -> str | None:
        name = self.required
        value = body.get(name)
        if value is None:
            return f"body.{name} is required for {self.endpoint}."
        if self.spec.input_shape == "messages":
            if not isinstance(value, list):
                return f"body.{name} must be an array (it is {_type_name(value)})."
            if not value:
                return f"body.{name} must not be empty."
        elif not isinstance(value, str | list):
            return f"body.{name} must be a string or an array (it is {_type_name(value)})."
        return None


def validate_input(
    f: BinaryIO,
    *,
    batch_id: str,
    endpoint: str,
    settings: Settings,
    allowed_models: frozenset[str] | None = None,
    max_errors: int = 100,
) -> ValidationOutcome:
    """Validate a batch input file, streamed once from `f`, and build its line index.

    Collects up to `max_errors` errors (one per line, the first check that fails) and then
    stops reading. More request lines than `limits.max_lines_per_batch` adds one
    `too_many_requests` error at the first line over the limit and stops reading. A file with
    no request lines gives one `empty_file` error. Without errors, every request line is routed
    with `choose_route` and the index fields of the outcome are filled.

    `endpoint` must be one of `ENDPOINTS` (ValueError otherwise: a caller bug).
    """
    if endpoint not in ENDPOINTS:
        raise ValueError(f"unsupported endpoint {endpoint!r}")
    if max_errors < 1:
        raise ValueError("max_errors must be at least 1")
    limits = settings.limits
    max_line = limits.max_line_bytes
    max_lines = limits.max_lines_per_batch
    checker = _LineChecker(endpoint, settings, allowed_models)

    out = ValidationOutcome()
    errors = out.errors
    offsets = out.offsets
    lengths = out.lengths
    route_index: dict[tuple[str, str], int] = {}
    counts: list[int] = []
    routes_seen: list[tuple[str, str]] = []
    models_seen: dict[str, None] = {}
    count = 0  # request lines so far

    for lineno, offset, raw, length in iter_lines(f, max_line + 1):
        if offset == 0 and raw is not None and raw.startswith(_BOM):
            raw = raw[len(_BOM) :]
            offset, length = len(_BOM), length - len(_BOM)
            if not raw or raw.isspace():
                continue
        if count >= max_lines:
            errors.append(
                BatchError(
                    code="too_many_requests",
                    line=lineno,
                    message=f"The batch has more than {max_lines} requests; "
                    f"the limit is {max_lines} requests per batch.",
                )
            )
            break
        index = count
        count += 1
        result: BatchError | CheckedLine
        if raw is None or length > max_line:
            result = BatchError(
                code="line_too_large",
                line=lineno,
                message=f"This line is {length} bytes; the limit is {max_line} bytes per line.",
            )
        else:
            result = checker.check(raw, lineno)
        if isinstance(result, BatchError):
            errors.append(result)
            if len(errors) >= max_errors:
                break
            continue
        model_id, model_cfg, custom_id, body = result
        route = choose_route(model_cfg, batch_id, custom_id)
        refused = refused_field(endpoint, body, route)  # the route's body policy
        if refused is not None:
            errors.append(
                BatchError(
                    code="invalid_body",
                    line=lineno,
                    param=f"body.{refused}",
                    message=refusal_message(refused, route),
                )
            )
            if len(errors) >= max_errors:
                break
            continue
        if errors:
            continue  # the index is not needed any more; keep checking lines
        key = (model_id, route.id)
        slot = route_index.get(key)
        if slot is None:
            slot = route_index[key] = len(routes_seen)
            routes_seen.append(key)
            counts.append(0)
            out.route_line_numbers.append(array("I"))
            models_seen.setdefault(model_id, None)
        counts[slot] += 1
        out.route_line_numbers[slot].append(index)
        if limits.order_lines_by_prefix:
            out.prefix_keys.add(prefix_key(prompt_text(body, checker.spec.input_field)))
        offsets.append(offset)
        lengths.append(length)

    if count == 0 and not errors:
        errors.append(BatchError(code="empty_file", message="The input file contains no requests."))
    if errors:
        # Never hand back a partial index that could be written by mistake.
        return ValidationOutcome(errors=errors)
    out.routes = [
        RouteLines(route_id=route_id, model=model_id, count=n)
        for (model_id, route_id), n in zip(routes_seen, counts, strict=True)
    ]
    out.models = list(models_seen)
    return out
