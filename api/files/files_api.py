"""OpenAI Files API: upload (streamed, capped), list, retrieve, content, delete."""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Literal
from urllib.parse import quote

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from api.buffers import HeldStreamingResponse, take
from api.deps import BuffersDep, ClientDep, IdentityDep, SettingsDep, StoreDep
from api.errors import APIError, InvalidRequest, NotFound, TooManyRequests
from api.files.upload import read_upload
from api.listing_params import check_after
from api.platform_admin import audit
from api.schemas import (
    COMMON_ERRORS,
    UPLOAD_BODY,
    FileDeleted,
    FileList,
    FileObject,
    error_responses,
)
from api.tenancy import admission
from api.tenancy.admission import Pinned
from backfill.files import CHUNK_BYTES, Store, chunks
from backfill.files import FileObject as StoredFile
from backfill.platform.config import Settings
from backfill.tenancy.admission import pinned_bytes

router = APIRouter(prefix="/v1/files", tags=["files"], responses=COMMON_ERRORS)

ACCEPTED_PURPOSES = ("batch",)
DOWNLOAD_HELD_BYTES = 2 * CHUNK_BYTES
"""What a file download holds while it streams: the chunk in flight and the store's read buffer
(the S3 store reads ahead 1 MiB)."""


async def _visible(store: StoreDep, identity: IdentityDep, file_id: str) -> StoredFile:
    obj = await asyncio.to_thread(store.get_file, file_id)
    if obj is None or not identity.can_see(obj.workspace):
        raise NotFound(f"No such File object: {file_id}", param="id", code="file_not_found")
    return obj


@router.post(
    "",
    response_model=FileObject,
    responses=error_responses(403, 413, 429),
    openapi_extra=UPLOAD_BODY,
)
async def upload_file(
    request: Request,
    settings: SettingsDep,
    store: StoreDep,
    client: ClientDep,
    identity: IdentityDep,
) -> FileObject:
    identity.require_write()
    workspace = identity.workspace
    limit = settings.workspace_limits(workspace).max_stored_bytes
    pins = await admission.pinned(client, settings, workspace) if limit is not None else None
    room = await asyncio.to_thread(storage_room, settings, store, workspace, pins)
    parsed = await read_upload(request, store, settings.limits.max_file_bytes)
    upload = parsed.upload
    try:
        if upload is not None and room is not None and upload.size > room:
            raise _storage_limit(limit, workspace, pins)
        purpose = parsed.fields.get("purpose")
        if purpose is None:
            raise InvalidRequest("Missing required parameter: 'purpose'.", param="purpose")
        if purpose not in ACCEPTED_PURPOSES:
            raise InvalidRequest(
                f"Invalid purpose {purpose!r}: backfill accepts only 'batch'.", param="purpose"
            )
        if upload is None:
            raise InvalidRequest("Missing required parameter: 'file'.", param="file")
        expires_after = expiry_seconds(parsed.fields, "expires_after")
        obj = await asyncio.to_thread(
            upload.finish,
            workspace=workspace,
            filename=parsed.filename,
            purpose=purpose,
            now=int(time.time()),
            expires_after=expires_after or settings.limits.input_file_expiry_seconds,
        )
    finally:
        if upload is not None:
            await asyncio.to_thread(upload.abort)
    await asyncio.to_thread(_take_back_over_limits, settings, store, obj, pins)
    return FileObject.of(obj)


def _take_back_over_limits(
    settings: Settings, store: Store, obj: StoredFile, pins: Pinned | None
) -> None:
    """Uploads in parallel each saw room for themselves: the one that finds the workspace over
    a limit once it is stored takes itself back (docs/configuration.md, the bound)."""
    limits = settings.workspace_limits(obj.workspace)
    if limits.max_files is None and limits.max_stored_bytes is None:
        return
    files = store.list_files(obj.workspace)
    error: APIError | None = None
    if limits.max_files is not None and len(files) > limits.max_files:
        error = _file_limit(limits.max_files, obj.workspace)
    elif (
        limits.max_stored_bytes is not None
        and pins is not None
        and stored_bytes(files, pins) > limits.max_stored_bytes
    ):
        error = _storage_limit(limits.max_stored_bytes, obj.workspace, pins)
    if error is not None:
        store.delete_file(obj.id)
        raise error


def stored_bytes(files: list[StoredFile], pins: Pinned) -> int:
    """Bytes the workspace keeps stored: its files, plus the pinned inputs of its batches
    still held by admission whose uploaded file is gone (`backfill.tenancy.admission.pinned_bytes`),
    or their bound while admission does not answer (`api.tenancy.admission.pinned`)."""
    return sum(f.bytes for f in files) + pinned_bytes(pins.held, {f.id for f in files}) + pins.bound


def storage_room(
    settings: Settings, store: Store, workspace: str, pins: Pinned | None
) -> int | None:
    """Bytes the workspace may still store (None: no limit); 429 when it keeps `max_files`
    files already, or has no room at all (503 when there might be, but admission did not
    answer). `pins`: the pinned inputs (`api.tenancy.admission.pinned`), which count. Reads the
    workspace's own files only (through its index in the store), and only under a limit."""
    limits = settings.workspace_limits(workspace)
    if limits.max_files is None and limits.max_stored_bytes is None:
        return None
    files = store.list_files(workspace)
    if limits.max_files is not None and len(files) >= limits.max_files:
        raise _file_limit(limits.max_files, workspace)
    limit = limits.max_stored_bytes
    if limit is None:
        return None
    room = limit - stored_bytes(files, pins or Pinned(held=[]))
    if room <= 0:
        raise _storage_limit(limit, workspace, pins)
    return room


def _file_limit(limit: int, workspace: str) -> APIError:
    return TooManyRequests(
        f"Workspace {workspace!r} may keep at most {limit} files; delete files (or let them "
        "expire) before uploading more.",
        code="file_limit_exceeded",
    )


def _storage_limit(limit: int | None, workspace: str, pins: Pinned | None) -> APIError:
    """429, or the 503 of an unanswered admission when only the bound of the pinned inputs
    stood in the way."""
    if pins is not None and pins.unanswered is not None and pins.bound > 0:
        return pins.unanswered
    return TooManyRequests(
        f"Workspace {workspace!r} may store at most {limit} bytes of files; delete files "
        "(or let them expire) before uploading more.",
        code="storage_limit_exceeded",
    )


MIN_EXPIRY_SECONDS = 3600
MAX_EXPIRY_SECONDS = 30 * 86400


def expiry_seconds(fields: dict[str, str], name: str) -> int | None:
    """OpenAI's `expires_after` ({"anchor": "created_at", "seconds": 3600..2592000}) sent as
    form fields `<name>[anchor]` and `<name>[seconds]`; None when absent."""
    anchor = fields.get(f"{name}[anchor]")
    seconds = fields.get(f"{name}[seconds]")
    if anchor is None and seconds is None:
        return None
    return check_expiry(anchor, seconds, name)


def check_expiry(anchor: object, seconds: object, name: str) -> int:
    """Validate an expiry policy; the seconds it grants."""
    if anchor != "created_at":
        raise InvalidRequest(f"{name}.anchor must be 'created_at'.", param=f"{name}.anchor")
    try:
        value = int(str(seconds))
    except ValueError:
        value = -1
    if isinstance(seconds, bool) or not MIN_EXPIRY_SECONDS <= value <= MAX_EXPIRY_SECONDS:
        raise InvalidRequest(
            f"{name}.seconds must be an integer between {MIN_EXPIRY_SECONDS} and "
            f"{MAX_EXPIRY_SECONDS}.",
            param=f"{name}.seconds",
        )
    return value


@router.get("", response_model=FileList)
async def list_files(
    store: StoreDep,
    identity: IdentityDep,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
    order: Literal["asc", "desc"] = "desc",
    purpose: str | None = None,
) -> FileList:
    check_after(after, "file")
    workspace = None if identity.can_see(None) else identity.workspace
    stored = await asyncio.to_thread(store.list_files, workspace)
    files = [f for f in stored if purpose is None or f.purpose == purpose]
    return file_page(files, after=after, limit=limit, newest_first=order == "desc")


def file_page(
    files: list[StoredFile], *, after: str | None, limit: int, newest_first: bool = True
) -> FileList:
    """One page of a file listing, OpenAI's way: sorted by creation time (ties by id), starting
    after the file `after` names (400 if it is not in the listing), at most `limit` files."""
    files = sorted(files, key=lambda f: (f.created_at, f.id), reverse=newest_first)
    if after is not None:
        ids = [f.id for f in files]
        if after not in ids:
            raise InvalidRequest(f"No such File object for 'after': {after}", param="after")
        files = files[ids.index(after) + 1 :]
    page = files[:limit]
    return FileList.of([FileObject.of(f) for f in page], has_more=len(files) > limit)


@router.get("/{file_id}", response_model=FileObject, responses=error_responses(404))
async def retrieve_file(file_id: str, store: StoreDep, identity: IdentityDep) -> FileObject:
    return FileObject.of(await _visible(store, identity, file_id))


@router.get(
    "/{file_id}/content",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "The file's bytes, as uploaded or assembled",
            "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
            },
        },
        **error_responses(403, 404),
    },
)
async def file_content(
    file_id: str, store: StoreDep, identity: IdentityDep, buffers: BuffersDep
) -> StreamingResponse:
    obj = await _visible(store, identity, file_id)
    identity.require_content()
    audit.cross_workspace(identity, "file.content", obj.id, obj.workspace)
    # A chunk and the store's read buffer in flight, held until the stream ends (`api.buffers`).
    claim = take(buffers, obj.workspace, DOWNLOAD_HELD_BYTES)
    try:
        stream = await asyncio.to_thread(store.open_file, obj.id)
    except FileNotFoundError:  # deleted since its metadata was read
        claim.release()
        raise NotFound(
            f"No such File object: {file_id}", param="id", code="file_not_found"
        ) from None
    # A sync iterator: Starlette reads each chunk in a worker thread, off the event loop, and
    # closes it (and the stream) if the client goes away. One chunk in memory at a time.
    return HeldStreamingResponse(
        chunks(stream),
        claim,
        media_type="application/octet-stream",
        headers={"content-length": str(obj.bytes), "content-disposition": _attachment(obj)},
    )


def _attachment(obj: StoredFile) -> str:
    """`Content-Disposition` naming the file (RFC 6266; non-ASCII names percent-encoded)."""
    quoted = quote(obj.filename)
    if quoted != obj.filename:
        return f"attachment; filename*=utf-8''{quoted}"
    return f'attachment; filename="{obj.filename}"'


@router.delete("/{file_id}", response_model=FileDeleted, responses=error_responses(403, 404))
async def delete_file(file_id: str, store: StoreDep, identity: IdentityDep) -> FileDeleted:
    identity.require_write()
    obj = await _visible(store, identity, file_id)
    audit.cross_workspace(identity, "file.delete", obj.id, obj.workspace)
    await asyncio.to_thread(store.delete_file, obj.id)
    return FileDeleted(id=obj.id, deleted=True)
