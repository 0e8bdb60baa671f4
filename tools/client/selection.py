"""Which lines `retry` sends again: chosen from the original's error file, read back from its
input file. Pure: records and lines in, lines out."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, Literal

Kind = Literal["failed", "expired", "cancelled"]
KINDS: tuple[Kind, ...] = ("failed", "expired", "cancelled")


def kind_of(record: dict[str, Any]) -> Kind:
    """A record of an error file: never run before the batch expired, or was cancelled, or
    failed (an error answer, or no answer)."""
    error = record.get("error")
    code = error.get("code") if isinstance(error, dict) else None
    if code == "batch_expired":
        return "expired"
    if code == "batch_cancelled":
        return "cancelled"
    return "failed"


def status_of(record: dict[str, Any]) -> int | None:
    response = record.get("response")
    status = response.get("status_code") if isinstance(response, dict) else None
    return status if isinstance(status, int) and not isinstance(status, bool) else None


def parse_kinds(text: str) -> set[Kind]:
    kinds = {k.strip() for k in text.split(",") if k.strip()}
    unknown = kinds - set(KINDS)
    if unknown or not kinds:
        raise ValueError(f"--only takes a comma-separated list of {', '.join(KINDS)}")
    return kinds  # type: ignore[return-value]


def to_retry(
    error_records: Iterable[dict[str, Any]], only: set[Kind], skip_status: set[int]
) -> set[str]:
    """The custom_ids whose records are of a kind in `only`, without an answer in `skip_status`
    (say 400: sent again, it would fail again)."""
    out: set[str] = set()
    for record in error_records:
        if kind_of(record) not in only or status_of(record) in skip_status:
            continue
        custom_id = record.get("custom_id")
        if isinstance(custom_id, str):
            out.add(custom_id)
    return out


def input_lines(content: bytes, custom_ids: set[str]) -> list[bytes]:
    """The input's lines (as they were, byte for byte) whose custom_id is in `custom_ids`."""
    out = []
    for raw in content.splitlines():
        if not raw.strip():
            continue
        try:
            custom_id = json.loads(raw).get("custom_id")
        except (ValueError, AttributeError):
            continue
        if custom_id in custom_ids:
            out.append(raw)
    return out


def output_ids(content: bytes) -> set[str]:
    """The custom_ids of an output file (each a completed line)."""
    out: set[str] = set()
    for raw in content.splitlines():
        try:
            custom_id = json.loads(raw).get("custom_id")
        except (ValueError, AttributeError):
            continue
        if isinstance(custom_id, str):
            out.add(custom_id)
    return out
