"""Usage: tokens per day, workspace and service class over the last days, from the usage
journal (`api.usage.usage_api.usage_buckets`, what `GET /api/v1/admin/usage` serves).

Platform admins and auditors see every workspace (or one, filtered); a member sees its own."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated

from fastapi import Query, Request
from fastapi.responses import Response

from api.console.charts import bar_chart
from api.console.web import SessionDep, render, router
from api.deps import SettingsDep
from api.usage.usage_api import usage_buckets
from backfill.usage.journal import UsageTotal

DAY = 86400
SERVICE_CLASSES = ("batch", "live")


@dataclass
class DayRow:
    day: str
    """`YYYY-MM-DD` (UTC)."""
    workspace: str
    service_class: str
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def day_of(ts: int) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d")


def daily_rows(buckets: Iterable[UsageTotal]) -> list[DayRow]:
    """Hourly buckets summed per day x workspace x service class (models added up)."""
    rows: dict[tuple[str, str, str], DayRow] = {}
    for b in buckets:
        key = (day_of(b.hour), b.workspace, b.service_class)
        row = rows.setdefault(key, DayRow(*key))
        row.requests += b.requests
        row.prompt_tokens += b.prompt_tokens
        row.completion_tokens += b.completion_tokens
    return [rows[k] for k in sorted(rows)]


def day_labels(now: float, days: int) -> list[str]:
    first = int(now) // DAY * DAY - (days - 1) * DAY
    return [day_of(first + i * DAY) for i in range(days)]


@router.get("/usage", response_model=None)
async def usage_page(
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    days: Annotated[int, Query(ge=1, le=31)] = 7,
    workspace: str = "",
) -> Response:
    identity = session.identity
    ws = (workspace or None) if identity.can_see(None) else identity.workspace
    now = time.time()
    labels = day_labels(now, days)
    start = int(now) // DAY * DAY - (days - 1) * DAY
    buckets = await asyncio.to_thread(usage_buckets, settings.data_dir, ws, start, None)
    rows = daily_rows(buckets)
    per_day: dict[str, dict[str, int]] = defaultdict(dict)
    for r in rows:
        per_day[r.day][r.service_class] = per_day[r.day].get(r.service_class, 0) + r.total_tokens
    chart = bar_chart([(d[5:], per_day.get(d, {})) for d in labels], SERVICE_CLASSES)
    return render(
        request,
        "usage.html",
        session,
        rows=rows,
        chart=chart,
        days=days,
        workspace=ws or "",
    )
