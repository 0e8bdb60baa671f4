"""Streaming multipart/form-data parsing for `POST /v1/files`.

The file part goes straight into the store as it arrives, with the size cap enforced while
streaming (FastAPI's UploadFile would spool the whole body first). Parsing and the store's
writes (disk, or S3 parts) run in a worker thread, one chunk at a time, so a slow disk never
stalls the event loop."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fastapi import Request
from python_multipart.multipart import MultipartParser, parse_options_header

from api.errors import InvalidRequest, PayloadTooLarge
from api.middleware import BodyTooLarge
from backfill.files import FileTooLarge, Store, Upload

if TYPE_CHECKING:  # the library declares it for type checkers only
    from python_multipart.multipart import MultipartCallbacks

MAX_FIELD_BYTES = 4096
"""Largest value of a form field other than the file."""
MAX_PARTS = 16
"""Most parts in one form (the file, purpose, expires_after[...] and a few to spare)."""
MAX_HEADER_BYTES = 8192
"""Most header bytes in one part."""
log = logging.getLogger(__name__)


@dataclass
class ParsedUpload:
    upload: Upload | None = None
    filename: str = "upload.jsonl"
    fields: dict[str, str] = field(default_factory=dict)


class _FormReader:
    """The multipart parser's callbacks and what they share: the part being read (its name, its
    headers, a field's value so far), the counts bounded by `MAX_PARTS` and `MAX_HEADER_BYTES`,
    the upload the file part goes into, and the first error (after which nothing more is kept).
    The parser calls them in order, from one thread at a time."""

    def __init__(self, store: Store, max_bytes: int) -> None:
        self.store = store
        self.max_bytes = max_bytes
        self.out = ParsedUpload()
        self.errors: list[Exception] = []
        self.parts = 0
        self.name: str | None = None
        """The current part's name (None until its headers are read)."""
        self.is_file = False
        """The current part is the file (its data goes to the upload)."""
        self.headers: dict[bytes, bytes] = {}
        self.header_bytes = 0
        self.header_field = bytearray()
        self.header_value = bytearray()
        self.field_buf = bytearray()

    def callbacks(self) -> MultipartCallbacks:
        return {
            "on_part_begin": self.on_part_begin,
            "on_header_field": self.on_header_field,
            "on_header_value": self.on_header_value,
            "on_header_end": self.on_header_end,
            "on_headers_finished": self.on_headers_finished,
            "on_part_data": self.on_part_data,
            "on_part_end": self.on_part_end,
        }

    def fail(self, err: Exception) -> None:
        """Record `err` unless an earlier error stands (the first one is answered)."""
        if not self.errors:
            self.errors.append(err)

    def on_part_begin(self) -> None:
        self.name, self.is_file = None, False
        self.headers.clear()
        self.field_buf.clear()
        self.parts += 1
        self.header_bytes = 0
        if self.parts > MAX_PARTS:
            self.fail(InvalidRequest(f"The form has more than {MAX_PARTS} parts."))

    def _count_header(self, n: int) -> None:
        self.header_bytes += n
        if self.header_bytes > MAX_HEADER_BYTES:
            self.fail(
                InvalidRequest(f"A form part's headers are longer than {MAX_HEADER_BYTES} bytes.")
            )

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._count_header(end - start)
        if not self.errors:
            self.header_field.extend(data[start:end])

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._count_header(end - start)
        if not self.errors:
            self.header_value.extend(data[start:end])

    def on_header_end(self) -> None:
        self.headers[bytes(self.header_field).lower()] = bytes(self.header_value)
        self.header_field.clear()
        self.header_value.clear()

    def on_headers_finished(self) -> None:
        if self.errors:
            return
        _, disp = parse_options_header(self.headers.get(b"content-disposition", b""))
        self.name = disp.get(b"name", b"").decode(errors="replace")
        if b"filename" in disp and self.name == "file":
            out = self.out
            if out.upload is not None:
                # A second file would be appended to the first: refuse instead.
                self.fail(InvalidRequest("Only one 'file' part is allowed.", param="file"))
                return
            out.filename = disp[b"filename"].decode(errors="replace")[:256] or out.filename
            out.upload = self.store.begin_upload(self.max_bytes)
            self.is_file = True

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self.errors:
            return
        if self.is_file and self.out.upload is not None:
            try:
                self.out.upload.write(data[start:end])
            except FileTooLarge as err:
                self.fail(err)
        else:
            self.field_buf.extend(data[start:end])
            if len(self.field_buf) > MAX_FIELD_BYTES:
                self.fail(InvalidRequest(f"Form field {self.name!r} is too long."))

    def on_part_end(self) -> None:
        if not self.is_file and self.name:
            self.out.fields[self.name] = self.field_buf.decode(errors="replace")


async def read_upload(request: Request, store: Store, max_bytes: int) -> ParsedUpload:
    """Parse the form; the caller must `finish` or `abort` the returned upload."""
    ctype, params = parse_options_header(request.headers.get("content-type", ""))
    boundary = params.get(b"boundary")
    if ctype != b"multipart/form-data" or not boundary:
        raise InvalidRequest(
            "Expected a multipart/form-data body with 'file' and 'purpose'.", param="file"
        )
    form = _FormReader(store, max_bytes)
    parser = MultipartParser(
        boundary,
        form.callbacks(),
        # The parser's own bounds (per header line) sit above ours, so ours answer first,
        # with a clear message; a single line over twice our bound is "malformed".
        max_header_count=MAX_PARTS,
        max_header_size=2 * MAX_HEADER_BYTES,
    )
    out, errors = form.out, form.errors
    try:
        async for chunk in request.stream():
            # The callbacks run in that thread too (begin_upload, Upload.write); the loop
            # waits for each chunk, so they never run concurrently with each other.
            await asyncio.to_thread(parser.write, chunk)
            if errors:
                break
        parser.finalize()
    except asyncio.CancelledError:
        # Nobody will finish or abort this upload: drop its temp file now.
        if out.upload is not None:
            out.upload.abort()
        raise
    except BodyTooLarge as err:
        errors.append(err)
    except Exception as err:
        log.info("malformed multipart upload: %r", err)
        errors.append(err)
    if errors:
        if out.upload is not None:
            await asyncio.to_thread(out.upload.abort)
        first = errors[0]
        if isinstance(first, FileTooLarge | BodyTooLarge):
            raise file_too_large(max_bytes)
        if isinstance(first, InvalidRequest):
            raise first
        # Never the parser's text: it may name internals.
        raise InvalidRequest("The multipart/form-data body is malformed.", param="file")
    return out


def file_too_large(max_bytes: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"File is too large: the limit is {max_bytes} bytes.", param="file", code="file_too_large"
    )
