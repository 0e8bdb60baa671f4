"""Streaming multipart/form-data parsing for `POST /v1/files`.

The file part goes straight into the store as it arrives, with the size cap enforced while
streaming (FastAPI's UploadFile would spool the whole body first). Parsing and the store's disk
writes run in a worker thread, one chunk at a time, so a slow disk never stalls the event loop."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from fastapi import Request
from python_multipart.multipart import MultipartParser, parse_options_header

from api.errors import InvalidRequest, PayloadTooLarge
from backfill.store import FileStore, FileTooLarge, Upload

MAX_FIELD_BYTES = 4096


@dataclass
class ParsedUpload:
    upload: Upload | None = None
    filename: str = "upload.jsonl"
    fields: dict[str, str] = field(default_factory=dict)


async def read_upload(request: Request, store: FileStore, max_bytes: int) -> ParsedUpload:
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

    def on_part_begin() -> None:
        part.clear()
        headers.clear()
        field_buf.clear()

    def on_header_field(data: bytes, start: int, end: int) -> None:
        header_field.extend(data[start:end])

    def on_header_value(data: bytes, start: int, end: int) -> None:
        header_value.extend(data[start:end])

    def on_header_end() -> None:
        headers[bytes(header_field).lower()] = bytes(header_value)
        header_field.clear()
        header_value.clear()

    def on_headers_finished() -> None:
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
    except Exception as err:
        errors.append(err)
    if errors:
        if out.upload is not None:
            await asyncio.to_thread(out.upload.abort)
        first = errors[0]
        if isinstance(first, FileTooLarge):
            raise PayloadTooLarge(
                f"File is too large: the limit is {max_bytes} bytes.",
                param="file",
                code="file_too_large",
            )
        if isinstance(first, InvalidRequest):
            raise first
        raise InvalidRequest(f"Malformed multipart body: {first}", param="file")
    return out
