"""The one JSON decoder for everything a client or a model server hands us: batch input lines
(validation, the line activity, finalizing), live request bodies, and upstream answers.

Strict in three ways Python's `json` is not:

- RFC 8259 only: `NaN`, `Infinity` and `-Infinity` are refused, and so is a number too large
  for a float (`1e999`), which Python would read as infinity and write back as `Infinity`
  (invalid JSON) when the body is sent on;
- UTF-8 only (no UTF-16/32 guessing on bytes);
- at most `MAX_DEPTH` levels of arrays and objects. The depth is counted here, before the
  decoder runs, so the limit does not depend on the recursion limit or on how much stack the
  calling thread has left (the C decoder recurses once per level).

A client's text (a live request body, a batch input line) is also read with `unique_keys`: an
object with the same key twice is refused, since the gateway's checks would read one value (the
last) and a model server may act on the other.

Every refusal is a `ValueError` (`json.JSONDecodeError` for syntax, `TooDeep`, `NotFinite`,
`DuplicateKey`, `UnicodeDecodeError`), so callers catch one type.
"""

from __future__ import annotations

import json
import math
import re
from itertools import accumulate
from typing import Any

MAX_DEPTH = 128
"""Most levels of nested arrays and objects accepted (a top-level object is level 1). Far
above what a real request needs (chat messages with tool schemas nest about ten levels) and
far below what Python's decoder can handle on any thread."""

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
"""A JSON string, escapes included (its brackets are text, not nesting)."""
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_AS_SQUARE = bytes.maketrans(b"{}", b"[]")
_STEP = [1 if b == ord("[") else -1 for b in range(256)]
_DIGITS_AS_ZERO = bytes.maketrans(b"123456789E", b"000000000e")


def _maybe_huge(data: bytes | bytearray) -> bool:
    """Whether `data` may hold a number that overflows a float: an exponent of three digits or
    more, or 309 digits in a row. A match inside a string only costs the careful decoder."""
    zeros = data.translate(_DIGITS_AS_ZERO)
    return b"e000" in zeros or b"e+000" in zeros or b"0" * 309 in zeros


class TooDeep(ValueError):
    """Nested deeper than the limit."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"it is nested more than {limit} levels deep")
        self.limit = limit


class NotFinite(ValueError):
    """NaN, Infinity, or a number too large to represent (1e999)."""


class DuplicateKey(ValueError):
    """An object with the same key twice (read with `unique_keys`)."""

    def __init__(self, key: str) -> None:
        super().__init__(f"the key {key[:64]!r} appears more than once in one object")
        self.key = key


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKey(key)
            seen.add(key)
    return obj


def _reject_constant(name: str) -> Any:
    raise NotFinite(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise NotFinite(f"the number {text[:40]} is too large")
    return value


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
_CAREFUL_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)
"""Checks every float: slower (a Python call per number), used only when `_maybe_huge` finds
one."""
_UNIQUE_DECODER = json.JSONDecoder(
    parse_constant=_reject_constant, object_pairs_hook=_unique_object
)
_UNIQUE_CAREFUL_DECODER = json.JSONDecoder(
    parse_constant=_reject_constant, parse_float=_finite_float, object_pairs_hook=_unique_object
)
"""The two above, refusing an object with a key twice (a Python call per object)."""


def _deepest(bare: bytes) -> int:
    """The deepest level reached in a string of brackets (`[` opens, anything else closes)."""
    return max(accumulate(map(_STEP.__getitem__, bare), initial=0))


def check_depth(data: bytes | bytearray, limit: int = MAX_DEPTH) -> None:
    """Raise `TooDeep` when `data` nests more than `limit` levels (strings skipped)."""
    # Fewer brackets than the limit cannot nest deeper than it: the usual case, two C scans.
    if data.count(b"[") + data.count(b"{") <= limit:
        return
    bare = _STRING.sub(b"", data).translate(_AS_SQUARE, _NOT_BRACKETS)
    # Each round drops the innermost pairs, one level of nesting: nothing left after `limit`
    # rounds means no deeper nesting. Balanced input takes this path, in C.
    rest = bare
    for _ in range(limit):
        if not rest:
            return
        shorter = rest.replace(b"[]", b"")
        if len(shorter) == len(rest):
            break  # unbalanced (invalid JSON): measure exactly what the decoder would enter
        rest = shorter
    else:
        if rest:
            raise TooDeep(limit)
        return
    if _deepest(bare) > limit:
        raise TooDeep(limit)


def loads(
    data: bytes | bytearray | str,
    *,
    max_depth: int = MAX_DEPTH,
    finite: bool = True,
    unique_keys: bool = False,
) -> Any:
    """Decode one JSON text strictly (see the module). Raises `ValueError` on any refusal.

    `finite=False` reads a number too large for a float as infinity instead of refusing it: for
    texts kept byte for byte as they came (an upstream answer spliced into a record), which are
    only looked at, never written again from their decoding. NaN and Infinity are refused
    either way.

    `unique_keys` refuses an object with the same key twice (`DuplicateKey`): for a client's
    text, which the gateway checks and forwards as sent."""
    raw = data.encode() if isinstance(data, str) else data
    check_depth(raw, max_depth)
    text = data if isinstance(data, str) else raw.decode("utf-8")
    careful = finite and _maybe_huge(raw)
    if unique_keys:
        return (_UNIQUE_CAREFUL_DECODER if careful else _UNIQUE_DECODER).decode(text)
    return (_CAREFUL_DECODER if careful else _DECODER).decode(text)


def describe(err: ValueError) -> str:
    """Why `loads` refused a text, as the end of "… is not valid JSON: <this>."."""
    if isinstance(err, json.JSONDecodeError):
        return f"{err.msg} (column {err.colno})"
    if isinstance(err, UnicodeDecodeError):
        return f"it is not UTF-8 (invalid byte at position {err.start})"
    return str(err)
