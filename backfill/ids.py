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
    return value.startswith("file-") and 5 < len(value) <= 64 and value[5:].isalnum()


def is_batch_id(value: str) -> bool:
    return value.startswith("batch_") and 6 < len(value) <= 64 and value[6:].isalnum()
