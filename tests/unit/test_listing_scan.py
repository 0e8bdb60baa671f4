"""A job listing reads about a page, not a workspace's whole history: with jobs rare among
its batches, each page examines at most `SCAN_ROWS` batches (plus the window it was reading),
ends early with `has_more` and a `last_id` to go on from, and following `last_id` finds every
job once, in order. Against a visibility fake that answers the listing's own queries (windows
of `BackfillCreatedAt`, the cursor's `WorkflowId`) from a list of batches. And a query Temporal
refuses is the caller's 400, never read as an outage."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from temporalio.service import RPCError, RPCStatusCode

from api.batches import reads as batch_reads
from api.batches.reads import SCAN_ROWS, list_page, list_window_rows
from api.errors import TEMPORAL_TRANSIENT, InvalidRequest
from backfill.batches import search_attributes as sa
from backfill.batches.batch import Batch
from backfill.platform.ids import new_batch_id

NOW = 2_000_000_000
LIMIT = 20


@dataclass
class Execution:
    id: str
    created: int
    job: bool
    status: Any = None

    @property
    def typed_search_attributes(self) -> dict[Any, int]:
        return {sa.CREATED_AT: self.created}


@dataclass
class Counted:
    count: int


@dataclass
class Visibility:
    """The listing's queries answered from `batches`; counts the rows each page reads."""

    batches: list[Execution]
    examined: int = 0
    queries: list[str] = field(default_factory=list)

    def _match(self, query: str) -> list[Execution]:
        self.queries.append(query)
        found = self.batches
        for op, value in re.findall(rf"{sa.CREATED_AT.name} (>=|<=|<) (\d+)", query):
            v = int(value)
            found = [
                b
                for b in found
                if {">=": b.created >= v, "<=": b.created <= v, "<": b.created < v}[op]
            ]
        if m := re.search(r"WorkflowId = '([^']*)'", query):
            found = [b for b in found if b.id == m[1]]
        return found

    async def count_workflows(self, query: str) -> Counted:
        return Counted(len(self._match(query)))

    async def list_workflows(self, query: str, page_size: int) -> AsyncIterator[Execution]:
        for b in self._match(query):
            self.examined += 1
            yield b


async def is_job(ex: Any) -> bool:
    return bool(ex.job)


@pytest.fixture(autouse=True)
def _batches_as_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    async def stub(client: Any, batch_id: str, statuses: Any) -> Batch:
        return Batch(
            id=batch_id, endpoint="", input_file_id="", completion_window="", created_at=0,
            status="completed",
        )  # fmt: skip

    monkeypatch.setattr(batch_reads, "load_or_stub", stub)
    monkeypatch.setattr(batch_reads.time, "time", lambda: NOW)


async def test_a_job_listing_pages_through_a_long_history_a_bounded_scan_at_a_time() -> None:
    # 4,000 batches, one every 10 s, going back about 11 hours; the newest and the oldest are
    # jobs (the jobs listing's case: jobs rare among a workspace's batches).
    batches = [
        Execution(new_batch_id((NOW - 10 * i) * 1000), NOW - 10 * i, job=i in (0, 3999))
        for i in range(4000)
    ]
    temporal = Visibility(batches)
    found: list[str] = []
    after = None
    pages = 0
    while True:
        temporal.examined = 0
        page = await list_page(temporal, "", after=after, limit=LIMIT, keep=is_job)  # type: ignore[arg-type]
        pages += 1
        assert temporal.examined <= SCAN_ROWS + list_window_rows(LIMIT), temporal.examined
        found += [b.id for b in page.data]
        if not page.has_more:
            break
        assert page.last_id is not None
        after = page.last_id
        assert pages < 50
    assert found == [batches[0].id, batches[3999].id]
    assert pages > 1  # the history took several bounded pages


async def test_a_full_page_of_jobs_ends_at_its_last_job_as_before() -> None:
    batches = [Execution(new_batch_id((NOW - i) * 1000), NOW - i, job=True) for i in range(50)]
    temporal = Visibility(batches)
    page = await list_page(temporal, "", after=None, limit=LIMIT, keep=is_job)  # type: ignore[arg-type]
    assert [b.id for b in page.data] == [b.id for b in batches[:LIMIT]]
    assert page.has_more and page.last_id == batches[LIMIT - 1].id
    nxt = await list_page(temporal, "", after=page.last_id, limit=LIMIT, keep=is_job)  # type: ignore[arg-type]
    assert [b.id for b in nxt.data] == [b.id for b in batches[LIMIT : 2 * LIMIT]]


class Refusing(Visibility):
    """Visibility that answers every count with `status`."""

    def __init__(self, status: RPCStatusCode) -> None:
        super().__init__([])
        self.status = status

    async def count_workflows(self, query: str) -> Counted:
        raise RPCError("refused", self.status, b"")


async def test_a_query_temporal_refuses_is_a_400_and_only_unavailability_is_raised_as_such() -> (
    None
):
    with pytest.raises(InvalidRequest) as refused:
        await list_page(Refusing(RPCStatusCode.INVALID_ARGUMENT), "", after=None, limit=LIMIT)  # type: ignore[arg-type]
    assert refused.value.status == 400
    with pytest.raises(RPCError) as down:  # the error handler's 503 temporal_unavailable
        await list_page(Refusing(RPCStatusCode.UNAVAILABLE), "", after=None, limit=LIMIT)  # type: ignore[arg-type]
    assert down.value.status in TEMPORAL_TRANSIENT
