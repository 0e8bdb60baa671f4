"""`GET /api/v1/admin/usage`: hourly usage totals from the usage journal (`backfill.usage.journal`).

Platform admins and auditors read every workspace's totals (optionally one workspace's);
members get 403 `insufficient_role`. Totals are summed from every process's journal files on
each call, so they include every api and worker process's attempts once those are flushed
(within `UsageJournal.flush_seconds`).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel

from api.deps import SettingsDep
from api.errors import InvalidRequest
from api.platform_admin.batches import AdminReaderDep
from api.schemas import COMMON_ERRORS, error_responses
from backfill.usage.journal import UsageTotal, hourly_totals, read_entries

router = APIRouter(
    prefix="/api/v1/admin", tags=["admin"], responses=COMMON_ERRORS | error_responses(403)
)


class UsageList(BaseModel):
    object: Literal["list"] = "list"
    data: list[UsageTotal]


@router.get("/usage", response_model=UsageList)
async def usage_totals(
    settings: SettingsDep,
    identity: AdminReaderDep,
    workspace: str | None = None,
    start: Annotated[int | None, Query(alias="from", ge=0)] = None,
    end: Annotated[int | None, Query(alias="to", ge=0)] = None,
) -> UsageList:
    """Totals per hour x workspace x model x service class of the attempts with
    `from` <= time < `to` (Unix seconds; either may be left out)."""
    if start is not None and end is not None and end < start:
        raise InvalidRequest("`to` must not be before `from`.", param="to")

    return UsageList(
        data=await asyncio.to_thread(usage_buckets, settings.data_dir, workspace, start, end)
    )


def usage_buckets(
    data_dir: Path, workspace: str | None, start: int | None, end: int | None
) -> list[UsageTotal]:
    """The journal's hourly totals (blocking: it reads the files). Shared with the console.
    The journal is local to each api's data directory, whichever file store is used."""
    return hourly_totals(read_entries(data_dir, start, end), workspace)
