"""Object ids in OpenAI's style. Batch ids sort by creation time (millisecond prefix)."""

from __future__ import annotations

import secrets
import time


def new_file_id() -> str:
    return f"file-{secrets.token_hex(12)}"


def new_batch_id(now_ms: int | None = None) -> str:
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    return f"batch_{ms:012x}{secrets.token_hex(8)}"


def batch_created_ms(batch_id: str) -> int | None:
    """When a batch was created (Unix milliseconds), from its id; None if the id has no time."""
    try:
        return int(batch_id[6:18], 16) if is_batch_id(batch_id) else None
    except ValueError:
        return None


def scheduler_workflow_id(route_id: str) -> str:
    return f"route-scheduler:{route_id}"


def is_file_id(value: str) -> bool:
    """`file-` and 1 to 59 ASCII letters and digits (`new_file_id` makes 24 hex digits)."""
    return _is_id(value, "file-")


def is_batch_id(value: str) -> bool:
    """`batch_` and 1 to 58 ASCII letters and digits (`new_batch_id` makes 28 hex digits)."""
    return _is_id(value, "batch_")


def _is_id(value: str, prefix: str) -> bool:
    rest = value[len(prefix) :]
    return (
        value.startswith(prefix) and 0 < len(rest) <= 64 - len(prefix) and rest.isascii()
    ) and rest.isalnum()
