"""OpenAI Files API: upload (streamed, capped), list, retrieve, content, delete."""

from __future__ import annotations

import time
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse

from api.deps import IdentityDep, SettingsDep, StoreDep
from api.errors import InvalidRequest, NotFound
from api.upload import read_upload
from backfill.store import FileObject

router = APIRouter(prefix="/v1/files", tags=["files"])

ACCEPTED_PURPOSES = ("batch",)


def _visible(store: StoreDep, identity: IdentityDep, file_id: str) -> FileObject:
    obj = store.get_file(file_id)
    if obj is None or not identity.can_see(obj.workspace):
        raise NotFound(f"No such File object: {file_id}", param="id", code="file_not_found")
    return obj


@router.post("")
async def upload_file(
    request: Request, settings: SettingsDep, store: StoreDep, identity: IdentityDep
) -> dict[str, object]:
    identity.require_write()
    parsed = await read_upload(request, store, settings.limits.max_file_bytes)
    upload = parsed.upload
    try:
        purpose = parsed.fields.get("purpose")
        if purpose is None:
            raise InvalidRequest("Missing required parameter: 'purpose'.", param="purpose")
        if purpose not in ACCEPTED_PURPOSES:
            raise InvalidRequest(
                f"Invalid purpose {purpose!r}: backfill accepts only 'batch'.", param="purpose"
            )
        if upload is None:
            raise InvalidRequest("Missing required parameter: 'file'.", param="file")
        obj = upload.finish(
            workspace=identity.workspace,
            filename=parsed.filename,
            purpose=purpose,
            now=int(time.time()),
        )
    finally:
        if upload is not None:
            upload.abort()
    return obj.public()


@router.get("")
async def list_files(
    store: StoreDep,
    identity: IdentityDep,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
    order: Literal["asc", "desc"] = "desc",
    purpose: str | None = None,
) -> dict[str, object]:
    workspace = None if identity.can_see(None) else identity.workspace
    files = [f for f in store.list_files(workspace) if purpose is None or f.purpose == purpose]
    files.sort(key=lambda f: (f.created_at, f.id), reverse=order == "desc")
    if after is not None:
        ids = [f.id for f in files]
        if after not in ids:
            raise InvalidRequest(f"No such File object for 'after': {after}", param="after")
        files = files[ids.index(after) + 1 :]
    page = files[:limit]
    return {
        "object": "list",
        "data": [f.public() for f in page],
        "first_id": page[0].id if page else None,
        "last_id": page[-1].id if page else None,
        "has_more": len(files) > limit,
    }


@router.get("/{file_id}")
async def retrieve_file(file_id: str, store: StoreDep, identity: IdentityDep) -> dict[str, object]:
    return _visible(store, identity, file_id).public()


@router.get("/{file_id}/content")
async def file_content(file_id: str, store: StoreDep, identity: IdentityDep) -> FileResponse:
    obj = _visible(store, identity, file_id)
    return FileResponse(
        store.content_path(obj.id),
        media_type="application/octet-stream",
        filename=obj.filename,
    )


@router.delete("/{file_id}")
async def delete_file(file_id: str, store: StoreDep, identity: IdentityDep) -> dict[str, object]:
    identity.require_write()
    obj = _visible(store, identity, file_id)
    store.delete_file(obj.id)
    return {"id": obj.id, "object": "file", "deleted": True}
