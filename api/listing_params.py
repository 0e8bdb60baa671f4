"""What a listing's request input may be, checked before anything is read.

A listing's `after` is an id the api issued (the `last_id` of the previous page): a batch id
on the batch and job listings, a file id on the file listings. Anything else (another kind of
id, control characters, a value longer than any id) is a 400 naming `param: after`, before
the value can reach a visibility query or the store. The results pages' cursor is their own
(`api.batches.results.Cursor`).

A filter's value that goes into a visibility query (an admin listing's `workspace`, `model`)
holds no control character and is at most `MAX_FILTER_CHARS` long: Temporal's SQL visibility
cuts a query at a NUL and answers the broken query UNAVAILABLE, which no one can tell from an
outage, so such a value never reaches it (400 naming the parameter)."""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from typing import Literal

from api.errors import InvalidRequest
from backfill.platform.ids import is_batch_id, is_file_id

Kind = Literal["batch", "file"]
_CHECKS: dict[Kind, Callable[[str], bool]] = {"batch": is_batch_id, "file": is_file_id}
SHOWN_CHARS = 40
"""Most characters of a refused value the error repeats."""
MAX_FILTER_CHARS = 256
"""Longest filter value a listing takes (workspace names and model ids are far shorter)."""


def check_after(after: str | None, kind: Kind) -> str | None:
    """`after` if it is None or an id of `kind`; else 400 `param: after`."""
    if after is None or _CHECKS[kind](after):
        return after
    raise InvalidRequest(
        f"Invalid 'after': {_shown(after)} is not a {kind} id; pass the `last_id` of the "
        "previous page.",
        param="after",
        code="invalid_cursor",
    )


def check_filter(value: str, param: str) -> str:
    """`value` if a visibility query may hold it; else 400 naming `param`."""
    if len(value) <= MAX_FILTER_CHARS and not any(unicodedata.category(c) == "Cc" for c in value):
        return value
    raise InvalidRequest(
        f"Invalid '{param}': {_shown(value)} holds control characters or is longer than "
        f"{MAX_FILTER_CHARS} characters.",
        param=param,
    )


def _shown(value: str) -> str:
    return repr(value if len(value) <= SHOWN_CHARS else value[:SHOWN_CHARS] + "…")
