"""`POST /v1/files`'s form parser (api.files.upload) on a real local store: the file part streamed
into an upload, the fields kept, and every bound answered with its own message."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from api.errors import InvalidRequest, PayloadTooLarge
from api.files.upload import MAX_FIELD_BYTES, MAX_HEADER_BYTES, MAX_PARTS, ParsedUpload, read_upload
from backfill.files.local import FileStore

BOUNDARY = "b0undary"


class Request:
    """What `read_upload` reads of a request: its content type and its body, in chunks."""

    def __init__(self, body: bytes, chunk: int = 7) -> None:
        self.headers = {"content-type": f"multipart/form-data; boundary={BOUNDARY}"}
        self._body, self._chunk = body, chunk

    async def stream(self) -> AsyncIterator[bytes]:
        for i in range(0, len(self._body), self._chunk):
            yield self._body[i : i + self._chunk]


def part(name: str, value: bytes, filename: str | None = None, extra: str = "") -> bytes:
    disp = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
    head = f"--{BOUNDARY}\r\nContent-Disposition: {disp}\r\n{extra}\r\n"
    return head.encode() + value + b"\r\n"


def form(*parts: bytes) -> bytes:
    return b"".join(parts) + f"--{BOUNDARY}--\r\n".encode()


def files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


async def parse(tmp_path: Path, body: bytes, max_bytes: int = 1000) -> ParsedUpload:
    return await read_upload(Request(body), FileStore(tmp_path), max_bytes)  # type: ignore[arg-type]


async def test_the_file_streams_into_an_upload_and_the_fields_are_kept(tmp_path: Path) -> None:
    lines = b'{"custom_id": "a"}\n' * 20
    got = await parse(tmp_path, form(part("purpose", b"batch"), part("file", lines, "in.jsonl")))
    assert got.fields == {"purpose": "batch"}
    assert got.filename == "in.jsonl"
    assert got.upload is not None and got.upload.size == len(lines)
    assert len(files(tmp_path)) == 1  # its temp file in the store
    got.upload.abort()
    assert files(tmp_path) == []


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            form(*(part(f"f{i}", b"x") for i in range(MAX_PARTS + 1))),
            f"The form has more than {MAX_PARTS} parts.",
        ),
        (
            form(part("purpose", b"batch", extra="X-Pad: " + "p" * MAX_HEADER_BYTES + "\r\n")),
            f"A form part's headers are longer than {MAX_HEADER_BYTES} bytes.",
        ),
        (
            form(part("purpose", b"b" * (MAX_FIELD_BYTES + 1))),
            "Form field 'purpose' is too long.",
        ),
        (
            form(part("file", b"{}\n", "a.jsonl"), part("file", b"{}\n", "b.jsonl")),
            "Only one 'file' part is allowed.",
        ),
        (b"--" + BOUNDARY.encode() + b"\r\nno headers end", None),
    ],
    ids=["parts", "headers", "field", "two-files", "malformed"],
)
async def test_each_bound_is_answered_with_its_message(
    tmp_path: Path, body: bytes, message: str | None
) -> None:
    with pytest.raises(InvalidRequest) as refused:
        await parse(tmp_path, body)
    expected = message or "The multipart/form-data body is malformed."
    assert str(refused.value) == expected
    assert files(tmp_path) == []  # an upload begun was aborted


async def test_a_file_over_the_cap_is_too_large_and_nothing_is_kept(tmp_path: Path) -> None:
    with pytest.raises(PayloadTooLarge, match="the limit is 100 bytes"):
        await parse(tmp_path, form(part("file", b"x" * 101, "big.jsonl")), max_bytes=100)
    assert files(tmp_path) == []
