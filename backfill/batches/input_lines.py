"""A batch input file's physical lines, streamed once, and the set of custom_ids seen so far:
what `backfill.batches.input_rules.validate_input` reads the file with.

The file is read in chunks of `CHUNK_BYTES` and split on b"\\n"; no line is buffered beyond
`keep` bytes: a longer one is only measured (its content is None) up to the next newline. Blank
lines are skipped.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Iterator
from typing import BinaryIO

CHUNK_BYTES = 1 << 20
"""How much of the file is read at a time."""


class _Pending:
    """The line that spans chunk boundaries: buffered up to `keep` bytes, then only measured."""

    __slots__ = ("keep", "parts", "size", "over", "nonblank", "last")

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.reset()

    def reset(self) -> None:
        self.parts: list[bytes] = []
        self.size = 0
        self.over = False
        self.nonblank = False
        self.last = b""

    def add(self, piece: bytes) -> None:
        if not piece:
            return
        self.size += len(piece)
        if self.over:
            if not self.nonblank and not piece.isspace():
                self.nonblank = True
            self.last = piece[-1:]
            return
        self.parts.append(piece)
        if self.size > self.keep:
            # Too long: stop buffering, keep only what the error and the blank check need.
            self.over = True
            self.nonblank = any(not p.isspace() for p in self.parts)
            self.last = piece[-1:]
            self.parts = []

    def take(self, lineno: int, offset: int) -> tuple[int, int, bytes | None, int] | None:
        if self.over:
            if not self.nonblank:
                return None
            return lineno, offset, None, self.size - (self.last == b"\r")
        raw = b"".join(self.parts)
        return _line(lineno, offset, raw)


def _line(lineno: int, offset: int, raw: bytes) -> tuple[int, int, bytes | None, int] | None:
    """A buffered physical line (without \\n): None when blank, else with any \\r stripped."""
    if not raw or raw.isspace():
        return None
    if raw[-1:] == b"\r":
        raw = raw[:-1]
    return lineno, offset, raw, len(raw)


def iter_lines(f: BinaryIO, keep: int) -> Iterator[tuple[int, int, bytes | None, int]]:
    """Non-blank physical lines as (1-based line number, byte offset, content, length).

    Content excludes the \\n and a trailing \\r; it is None for a line longer than `keep`
    bytes (not buffered), whose length is still exact.
    """
    lineno = 0
    pos = 0  # file offset of the next chunk
    start = 0  # file offset where the pending line starts
    pending = _Pending(keep)
    while True:
        chunk = f.read(CHUNK_BYTES)
        if not chunk:
            break
        pieces = chunk.split(b"\n")
        if len(pieces) == 1:
            pending.add(chunk)
            pos += len(chunk)
            continue
        head = pieces[0]
        pending.add(head)
        lineno += 1
        item = pending.take(lineno, start)
        if item is not None:
            yield item
        pending.reset()
        offset = pos + len(head) + 1
        for piece in pieces[1:-1]:
            lineno += 1
            if len(piece) <= keep:
                item = _line(lineno, offset, piece)
                if item is not None:
                    yield item
            elif not piece.isspace():
                yield lineno, offset, None, len(piece) - (piece[-1:] == b"\r")
            offset += len(piece) + 1
        start = offset
        pending.add(pieces[-1])
        pos += len(chunk)
    if pending.size:
        item = pending.take(lineno + 1, start)
        if item is not None:
            yield item


class SeenIds:
    """A set of custom_ids, each remembered with the line that first used it, in about 20
    bytes per id: a 128-bit hash per id in two flat arrays, found through an open-addressing
    table of 4-byte slots (linear probing, at most half full). Two different ids share a hash
    with a probability of about n²/2¹²⁹ (1e-28 at 200,000 ids)."""

    __slots__ = ("_lo", "_hi", "_lines", "_slots", "_mask")

    def __init__(self) -> None:
        self._lo = array("Q")
        self._hi = array("Q")
        self._lines = array("I")
        """The line number that first used each id, in insertion order."""
        self._slots = array("I", bytes(4 * 1024))
        """1 + the id's insertion index, 0 for an empty slot."""
        self._mask = 1024 - 1

    def __len__(self) -> int:
        return len(self._lines)

    def add(self, custom_id: str, lineno: int) -> int | None:
        """Remember `custom_id` as first used on `lineno`; if it was seen before, the line
        that first used it (and nothing changes)."""
        h = int.from_bytes(hashlib.blake2b(custom_id.encode(), digest_size=16).digest(), "little")
        lo, hi = h & _U64, h >> 64
        slots, mask = self._slots, self._mask
        slot = lo & mask
        while (item := slots[slot]) != 0:
            if self._lo[item - 1] == lo and self._hi[item - 1] == hi:
                return int(self._lines[item - 1])
            slot = (slot + 1) & mask
        self._lo.append(lo)
        self._hi.append(hi)
        self._lines.append(lineno)
        slots[slot] = len(self._lines)
        if 2 * len(self._lines) > mask:
            self._grow()
        return None

    def _grow(self) -> None:
        size = 2 * (self._mask + 1)
        slots = array("I", bytes(4 * size))
        mask = size - 1
        for item, lo in enumerate(self._lo, start=1):
            slot = lo & mask
            while slots[slot] != 0:
                slot = (slot + 1) & mask
            slots[slot] = item
        self._slots, self._mask = slots, mask


_U64 = (1 << 64) - 1
