"""Partial results (extension): `GET /v1/batches/{batch_id}/results?after=<cursor>&limit=N`.

The result records a batch has committed so far, as a JSON page, with a cursor so a client asks
only for what is new:

    {"object": "list",
     "data": [{"line": 0, "file": "output", "record": {...}}, ...],
     "next_after": "118.2", "has_more": true}

- While the batch runs, records come in input order, from its per-line results in the store:
  the page continues from the cursor and stops at the first line with no record yet (a line
  still running holds back the lines after it). `line` is the 0-based input line; `file` says
  which file the record ends up in (`output`: a 2xx answer; `error`: anything else).
- Once the batch's output and error files are assembled (its per-line results are then
  dropped), the rest comes from those files: what remains of the output file, then what remains
  of the error file (`line` is then null).

The cursor (`next_after`, opaque to clients) counts the records already served per file:
`<output records>.<error records>`. So a record appears once across fetches, and the records of
all pages together are exactly the final output and error files. `has_more` is false once the
batch has ended and everything was served.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Annotated, Any, BinaryIO, Literal

from fastapi import APIRouter, Query
from fastapi.responses import Response
from pydantic import BaseModel
from temporalio.client import WorkflowExecutionStatus

from api.batches.reads import describe_batch, workspace_of
from api.buffers import HeldResponse, take
from api.deps import BuffersDep, ClientDep, IdentityDep, StoreDep
from api.errors import InvalidRequest, NotFound
from api.platform_admin import audit
from api.schemas import COMMON_ERRORS, error_responses
from backfill.batches.records import outcome_from_record
from backfill.files import Store
from backfill.platform.messages import FinalizedFiles

router = APIRouter(prefix="/v1/batches", tags=["batches"], responses=COMMON_ERRORS)

PAGE_BYTES = 8 << 20
"""A page stops growing past this many bytes of records (it always holds at least one)."""
PAGE_READERS = 4
"""Pages read at once by one api process (more wait their turn)."""
READ_AHEAD = 16
"""Per-line results read at once while a batch runs (one request each on S3)."""

FileKind = Literal["output", "error"]


class ResultItem(BaseModel):
    line: int | None
    """The 0-based input line (null once served from the assembled files)."""
    file: FileKind
    record: dict[str, Any]
    """The record exactly as the output or error file holds it."""


class ResultPage(BaseModel):
    """The page's shape, for the OpenAPI schema (the body itself is built by `Page.body`)."""

    object: Literal["list"] = "list"
    data: list[ResultItem]
    next_after: str
    has_more: bool


@dataclass(frozen=True)
class Cursor:
    """How many records of each file a client already has."""

    output: int = 0
    error: int = 0

    @property
    def line(self) -> int:
        """While the batch runs: the next input line (the served records are a prefix)."""
        return self.output + self.error

    def __str__(self) -> str:
        return f"{self.output}.{self.error}"

    @classmethod
    def parse(cls, text: str | None) -> Cursor:
        """The cursor of `after`: two counts of ASCII digits (at most `CURSOR_DIGITS` each);
        anything else is a 400 (`"²"` is a digit to `str.isdigit`, not to `int`)."""
        if text is None or text == "":
            return cls()
        found = _CURSOR.fullmatch(text)
        if found is None:
            raise bad_cursor(text)
        return cls(int(found[1]), int(found[2]))


CURSOR_DIGITS = 15
_CURSOR = re.compile(rf"([0-9]{{1,{CURSOR_DIGITS}}})\.([0-9]{{1,{CURSOR_DIGITS}}})")


def bad_cursor(text: str, why: str = "") -> InvalidRequest:
    shown = text if len(text) <= 40 else text[:40] + "…"
    return InvalidRequest(
        f"Invalid cursor {shown!r}{why}: pass the `next_after` of the previous page.",
        param="after",
    )


@dataclass
class Page:
    cursor: Cursor
    items: list[tuple[int | None, FileKind, bytes]] = field(default_factory=list)
    size: int = 0

    def full(self, limit: int) -> bool:
        return len(self.items) >= limit or self.size >= PAGE_BYTES

    def add(self, line: int | None, kind: FileKind, record: bytes) -> None:
        self.items.append((line, kind, record))
        self.size += len(record)
        if kind == "output":
            self.cursor = Cursor(self.cursor.output + 1, self.cursor.error)
        else:
            self.cursor = Cursor(self.cursor.output, self.cursor.error + 1)

    def body(self, has_more: bool) -> bytes:
        """The page as JSON, each record spliced in as committed (valid JSON, byte for byte)."""
        parts = [
            b'{"line":%s,"file":"%s","record":%s}'
            % (b"null" if line is None else str(line).encode(), kind.encode(), record)
            for line, kind, record in self.items
        ]
        tail = json.dumps({"next_after": str(self.cursor), "has_more": has_more})
        return b'{"object":"list","data":[' + b",".join(parts) + b"]," + tail[1:].encode()


@router.get(
    "/{batch_id}/results",
    response_model=None,
    responses={
        200: {"model": ResultPage, "description": "A page of result records"},
        **error_responses(403, 404),
    },
)
async def batch_results(
    batch_id: str,
    client: ClientDep,
    store: StoreDep,
    identity: IdentityDep,
    buffers: BuffersDep,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> Response:
    """Extension: the batch's result records committed so far, from the cursor `after`."""
    cursor = Cursor.parse(after)
    desc = await describe_batch(client, identity, batch_id)
    identity.require_content()
    audit.cross_workspace(identity, "batch.results", batch_id, workspace_of(desc))
    running = desc.status in (
        WorkflowExecutionStatus.RUNNING,
        WorkflowExecutionStatus.CONTINUED_AS_NEW,
    )
    loop = asyncio.get_running_loop()
    page, has_more = await loop.run_in_executor(_PAGES, read_page, store, batch_id, cursor, limit)
    body = page.body(has_more or running)
    del page
    # Built in one of `PAGE_READERS` threads; held from here until sent (`api.buffers`).
    return HeldResponse(body, take(buffers, workspace_of(desc), len(body)))


_PAGES = ThreadPoolExecutor(PAGE_READERS, thread_name_prefix="result-pages")
"""Pages are read here, not on the event loop's default pool the rest of the api shares."""


def read_page(store: Store, batch_id: str, cursor: Cursor, limit: int) -> tuple[Page, bool]:
    """A page from the cursor, and whether the store holds more right now (the caller adds
    "the batch still runs"). The assembled files win: once they exist the per-line results may
    be gone at any moment; a line found missing meanwhile only ends the page early."""
    done = store.read_finalized(batch_id)
    if done is not None:
        return _from_files(store, FinalizedFiles.model_validate_json(done), cursor, limit)
    page = _from_lines(store, batch_id, cursor, limit)
    return page, page.full(limit)


def _from_lines(store: Store, batch_id: str, cursor: Cursor, limit: int) -> Page:
    page = Page(cursor)
    try:
        total = store.index_total(batch_id)
    except FileNotFoundError:  # still validating (or it never got an index)
        total = 0
    if cursor.line > total:
        raise bad_cursor(str(cursor), f": the batch has {total} lines")
    end = min(total, cursor.line + limit)
    with ThreadPoolExecutor(READ_AHEAD, thread_name_prefix="results") as pool:
        for start in range(cursor.line, end, READ_AHEAD):
            lines = range(start, min(end, start + READ_AHEAD))
            records = pool.map(lambda n: store.get_result(batch_id, n), lines)
            for n, record in zip(lines, records, strict=True):
                if record is None or page.full(limit):
                    return page
                outcome = outcome_from_record(n, record)
                if outcome.error_code == "invalid_record":
                    # Finalizing puts a readable error record in its place: wait for that one.
                    return page
                page.add(n, "output" if outcome.ok else "error", record)
    return page


def _from_files(
    store: Store, done: FinalizedFiles, cursor: Cursor, limit: int
) -> tuple[Page, bool]:
    """From the assembled files, each read from the cursor's record on: by the sparse index
    (`FinalizedFiles`) a page reads at most `stride - 1` records before its first, whatever the
    cursor; a batch finalized before the index reads from the file's start."""
    if cursor.output > done.completed or cursor.error > done.failed:
        raise bad_cursor(
            str(cursor), f": the batch has {done.completed} output and {done.failed} error records"
        )
    page = Page(cursor)
    files: list[tuple[FileKind, str | None, int, int, list[int] | None]] = [
        ("output", done.output_file_id, cursor.output, done.completed, done.output_offsets),
        ("error", done.error_file_id, cursor.error, done.failed, done.error_offsets),
    ]
    for kind, file_id, skip, count, offsets in files:
        if file_id is None or skip >= count:
            continue
        start, skip = _seek_point(skip, offsets, done.stride)
        try:
            f = store.open_file_from(file_id, start)
        except FileNotFoundError:
            raise NotFound(
                f"The batch's {kind} file {file_id} is no longer available (deleted or expired).",
                param="batch_id",
                code="file_not_found",
            ) from None
        with f:
            rest = itertools.islice(_records(f), skip, None)
            for record in rest:
                if page.full(limit):
                    return page, True
                page.add(None, kind, record)
    return page, False


def _seek_point(skip: int, offsets: list[int] | None, stride: int) -> tuple[int, int]:
    """(byte offset to read from, records to pass over there) for the `skip`-th record."""
    if not offsets or stride < 1:
        return 0, skip
    mark = min(skip // stride, len(offsets) - 1)
    return offsets[mark], skip - mark * stride


def _records(f: BinaryIO) -> Iterator[bytes]:
    for raw in f:
        record = raw.rstrip(b"\n")
        if record:
            yield record
