"""Streaming multipart/form-data parsing for `POST /v1/files`.

The file part goes straight into the store as it arrives, with the size cap enforced while
streaming (FastAPI's UploadFile would spool the whole body first). Parsing and the store's
writes (disk, or S3 parts) run in a worker thread, one chunk at a time, so a slow disk never
stalls the event loop."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from fastapi import Request
from python_multipart.multipart import MultipartParser, parse_options_header

from api.errors import InvalidRequest, PayloadTooLarge
from api.middleware import BodyTooLarge
from backfill.store import FileTooLarge, Store, Upload

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


async def read_upload(request: Request, store: Store, max_bytes: int) -> ParsedUpload:
    """Parse the form; the caller must `finish` or `abort` the returned upload."""
    ctype, params = parse_options_header(request.headers.get("content-type", ""))
    boundary = params.get(b"boundary")
    if ctype != b"multipart/form-data" or not boundary:
        raise InvalidRequest(
            "Expected a multipart/form-data body with 'file' and 'purpose'.", param="file"
        )
    out = ParsedUpload()
    part: dict[str, object] = {}
    headers: dict[bytes, bytes] = {}
    header_field = bytearray()
    header_value = bytearray()
    field_buf = bytearray()
    errors: list[Exception] = []

    counts = {"parts": 0, "header_bytes": 0}

    def on_part_begin() -> None:
        part.clear()
        headers.clear()
        field_buf.clear()
        counts["parts"] += 1
        counts["header_bytes"] = 0
        if counts["parts"] > MAX_PARTS and not errors:
            errors.append(InvalidRequest(f"The form has more than {MAX_PARTS} parts."))

    def count_header(n: int) -> None:
        counts["header_bytes"] += n
        if counts["header_bytes"] > MAX_HEADER_BYTES and not errors:
            errors.append(
                InvalidRequest(f"A form part's headers are longer than {MAX_HEADER_BYTES} bytes.")
            )

    def on_header_field(data: bytes, start: int, end: int) -> None:
        count_header(end - start)
        if not errors:
            header_field.extend(data[start:end])

    def on_header_value(data: bytes, start: int, end: int) -> None:
        count_header(end - start)
        if not errors:
            header_value.extend(data[start:end])

    def on_header_end() -> None:
        headers[bytes(header_field).lower()] = bytes(header_value)
        header_field.clear()
        header_value.clear()

    def on_headers_finished() -> None:
        if errors:
            return
        _, disp = parse_options_header(headers.get(b"content-disposition", b""))
        name = disp.get(b"name", b"").decode(errors="replace")
        part["name"] = name
        if b"filename" in disp and name == "file":
            if out.upload is not None:
                # A second file would be appended to the first: refuse instead.
                errors.append(InvalidRequest("Only one 'file' part is allowed.", param="file"))
                return
            out.filename = disp[b"filename"].decode(errors="replace")[:256] or out.filename
            out.upload = store.begin_upload(max_bytes)
            part["file"] = True

    def on_part_data(data: bytes, start: int, end: int) -> None:
        if errors:
            return
        if part.get("file") and out.upload is not None:
            try:
                out.upload.write(data[start:end])
            except FileTooLarge as err:
                errors.append(err)
        else:
            field_buf.extend(data[start:end])
            if len(field_buf) > MAX_FIELD_BYTES:
                errors.append(InvalidRequest(f"Form field {part.get('name')!r} is too long."))

    def on_part_end() -> None:
        if not part.get("file") and part.get("name"):
            out.fields[str(part["name"])] = field_buf.decode(errors="replace")

    parser = MultipartParser(
        boundary,
        {
            "on_part_begin": on_part_begin,
            "on_header_field": on_header_field,
            "on_header_value": on_header_value,
            "on_header_end": on_header_end,
            "on_headers_finished": on_headers_finished,
            "on_part_data": on_part_data,
            "on_part_end": on_part_end,
        },
        # The parser's own bounds (per header line) sit above ours, so ours answer first,
        # with a clear message; a single line over twice our bound is "malformed".
        max_header_count=MAX_PARTS,
        max_header_size=2 * MAX_HEADER_BYTES,
    )
    try:
        async for chunk in request.stream():
            # The callbacks above run in that thread too (begin_upload, Upload.write); the loop
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
