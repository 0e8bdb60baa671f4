"""Line order for the prefix cache: within a batch, the lines of a route that share a prompt
prefix (a system prompt, a long document asked several questions) are put next to each other in
the route's line list, so they start together and the model server's prefix cache serves them.
Pure, and decided once, at validation: the route's line list (`route-<n>.bin`) is the order the
batch starts its lines in; the output stays in input order (it is assembled by line number).

The prompt is the body's input field (`messages`, `prompt`, `input`; a response's
`instructions` first), its keys and strings in order, which starts the way the tokens the model
server sees start. A line's
key is the hashes of its prompt's first `BLOCK_BYTES`, `2 × BLOCK_BYTES`, ... bytes of UTF-8, up
to `MAX_BLOCKS` (the last one may be shorter: the whole prompt). Lines are sorted by, level after
level, the place where that level's prefix first appeared in the route's lines: a trie walked in
input order. Lines whose prompts share nothing stay in input order; a group starts where its
first line was.
"""

from __future__ import annotations

import hashlib
import json
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

BLOCK_BYTES = 256
"""Bytes per level: about 64 tokens of English, four of vLLM's default 16-token blocks."""
MAX_BLOCKS = 16
"""Levels of the key: lines whose prompts share their first 4,096 bytes keep their input order
among themselves."""
DIGEST_BYTES = 8
PrefixKey = bytes
"""The digests (`DIGEST_BYTES` each) of a prompt's cumulative prefixes, one per level, end to
end: one object per line (a tuple of digests would take about four times the memory)."""


def prompt_text(body: dict[str, object], input_field: str) -> str:
    """What of the body the model server puts first (a response's `instructions`, then the
    endpoint's input field): its keys and strings in order, each ended by a separator, at most
    `BLOCK_BYTES × MAX_BLOCKS` characters of it (a long document is not copied whole)."""
    room = BLOCK_BYTES * MAX_BLOCKS
    out: list[str] = []

    def walk(value: object) -> None:
        nonlocal room
        if room <= 0:
            return
        if isinstance(value, dict):
            for k, v in value.items():
                walk(k)
                walk(v)
            return
        if isinstance(value, list):
            for v in value:
                walk(v)
            return
        text = value if isinstance(value, str) else json.dumps(value)
        piece = text[:room] + "\x1f"
        out.append(piece)
        room -= len(piece)

    if input_field == "input" and "instructions" in body:
        walk(body["instructions"])
    walk(body.get(input_field))
    return "".join(out)


def prefix_key(text: str) -> PrefixKey:
    """The digests of the text's cumulative prefixes, level by level."""
    data = text.encode("utf-8", "surrogatepass")
    h = hashlib.blake2b(digest_size=DIGEST_BYTES)
    out: list[bytes] = []
    for start in range(0, min(len(data), BLOCK_BYTES * MAX_BLOCKS), BLOCK_BYTES):
        h.update(data[start : start + BLOCK_BYTES])
        out.append(h.digest())
    return b"".join(out) or h.digest()


def levels(key: PrefixKey) -> list[bytes]:
    """A key's digests, shortest prefix first."""
    return [key[i : i + DIGEST_BYTES] for i in range(0, len(key), DIGEST_BYTES)]


@dataclass
class PrefixKeys:
    """Every line's key, end to end in one buffer (no Python object per line: validation keeps
    what it reads of a file bounded)."""

    data: bytearray = field(default_factory=bytearray)
    ends: array = field(default_factory=lambda: array("Q"))

    def add(self, key: PrefixKey) -> None:
        self.data += key
        self.ends.append(len(self.data))

    def __len__(self) -> int:
        return len(self.ends)

    def __getitem__(self, n: int) -> PrefixKey:
        return bytes(self.data[self.ends[n - 1] if n else 0 : self.ends[n]])


def order(keys: Sequence[PrefixKey]) -> list[int]:
    """Indexes of `keys` in the order to start their lines: sorted by, at each level, where the
    prefix up to that level first appeared (so by input order where nothing is shared)."""
    first: list[dict[bytes, int]] = [{} for _ in range(MAX_BLOCKS)]
    ranks: list[tuple[int, ...]] = []
    for i, key in enumerate(keys):
        ranks.append(tuple(first[lvl].setdefault(h, i) for lvl, h in enumerate(levels(key))))
    return sorted(range(len(keys)), key=lambda i: (ranks[i], i))


def reorder(line_numbers: array, keys: PrefixKeys | Sequence[PrefixKey]) -> array:
    """A route's line list (input line numbers, in input order) in prefix order; `keys` holds
    the key of each of the batch's indexed lines, by line number."""
    mine = [keys[n] for n in line_numbers]
    return array(line_numbers.typecode, (line_numbers[i] for i in order(mine)))
