"""A page of `GET /v1/batches/{id}/results` read with each record's bytes exactly as the server
sent them: the server splices every record in as committed, and the partial files the CLI writes
must hold the same bytes as the batch's final files. Decoding a record and encoding it again
would not: non-ASCII text would come back escaped, `1.10` as `1.1`, and `1e999` as `Infinity`
(which is not JSON).

The page's frame (`data`, `file`, `next_after`, `has_more`) is decoded; a `record` value is only
scanned for where it ends (`json.JSONDecoder.raw_decode`) and kept as its text."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

_SPACE = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


@dataclass
class RawPage:
    """One page: its records in order, each `(file, record bytes)`, and its cursor."""

    records: list[tuple[str, bytes]] = field(default_factory=list)
    """`file` is `output` or `error`; the record is the JSON text the page holds for it."""
    next_after: str = ""
    has_more: bool = False


def read_page(body: bytes) -> RawPage:
    """The page in `body`; ValueError if it is not a results page."""
    scan = _Scanner(body.decode())
    page = RawPage()
    for key in scan.members():
        if key == "data":
            for _ in scan.elements():
                page.records.append(_item(scan))
        elif key == "next_after":
            page.next_after = str(scan.value())
        elif key == "has_more":
            page.has_more = bool(scan.value())
        else:
            scan.value()
    scan.end()
    return page


def _item(scan: _Scanner) -> tuple[str, bytes]:
    kind: Any = None
    record: str | None = None
    for key in scan.members():
        if key == "record":
            record = scan.raw_value()
        elif key == "file":
            kind = scan.value()
        else:
            scan.value()
    if kind not in ("output", "error") or record is None:
        raise ValueError("a results page item without its file or record")
    return kind, record.encode()


class _Scanner:
    """A cursor over one JSON text, walked value by value."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def _next(self) -> str:
        """The next character after white space (empty at the end), not consumed."""
        self.pos = _SPACE.match(self.text, self.pos).end()  # type: ignore[union-attr]
        return self.text[self.pos : self.pos + 1]

    def _expect(self, char: str) -> None:
        if self._next() != char:
            raise ValueError(f"expected {char!r} at character {self.pos}")
        self.pos += 1

    def value(self) -> Any:
        """The next value, decoded."""
        self._next()
        found, self.pos = _DECODER.raw_decode(self.text, self.pos)
        return found

    def raw_value(self) -> str:
        """The next value's text, as it stands."""
        self._next()
        start = self.pos
        _, self.pos = _DECODER.raw_decode(self.text, self.pos)
        return self.text[start : self.pos]

    def members(self) -> Iterator[str]:
        """An object's keys; the caller reads each key's value before asking for the next."""
        for _ in self._items("{", "}"):
            key = self.value()
            if not isinstance(key, str):
                raise ValueError(f"expected a key at character {self.pos}")
            self._expect(":")
            yield key

    def elements(self) -> Iterator[None]:
        """An array's elements; the caller reads each one before asking for the next."""
        yield from self._items("[", "]")

    def _items(self, opening: str, closing: str) -> Iterator[None]:
        """The comma-separated items between `opening` and `closing`, one step each."""
        self._expect(opening)
        if self._next() == closing:
            self.pos += 1
            return
        while True:
            yield None
            if self._next() == ",":
                self.pos += 1
                continue
            self._expect(closing)
            return

    def end(self) -> None:
        if self._next():
            raise ValueError(f"extra data at character {self.pos}")
