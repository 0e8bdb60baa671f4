"""One pass over a batch's input at create: how many lines it has, and its first request line.

The create needs both (the line count for admission's queued-lines limit and the estimate at
submit; the first line for the estimate's model), and the input may be hundreds of megabytes in
a remote store: it is read once, in chunks, and only the first line's bytes are kept.
"""

from __future__ import annotations

from dataclasses import dataclass

from backfill.files import Store, chunks

FIRST_LINE_BYTES = 1 << 20
"""The most kept of the input's beginning to find its first request line."""


@dataclass(frozen=True)
class InputScan:
    """What one pass over an uploaded input found."""

    lines: int
    """Its lines (a last line without its newline counts)."""
    head: bytes
    """Its beginning, up to the end of its first non-blank line (or FIRST_LINE_BYTES bytes or
    more, when that line is longer)."""


def scan_input(store: Store, file_id: str) -> InputScan:
    """Count the lines of uploaded file `file_id` and keep its first line, in one read."""
    lines, last, head, heading = 0, b"\n", b"", True
    for chunk in chunks(store.open_file(file_id)):
        lines += chunk.count(b"\n")
        last = chunk[-1:]
        if heading:
            head += chunk
            heading = b"\n" not in head.lstrip() and len(head) < FIRST_LINE_BYTES
    return InputScan(lines=lines + (last != b"\n"), head=head)
