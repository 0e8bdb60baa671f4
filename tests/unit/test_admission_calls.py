"""The api's side of admission (issue 40, decision 0027), against a stand-in Temporal client: no
answer is a 503 with Retry-After (never an admission by guess) and releases the batch id; the
creates waiting their turn behind an unanswered one are refused at once; Temporal's refusal of
more in-flight updates is waited out, not answered 5xx."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from temporalio.service import RPCError, RPCStatusCode

from api.errors import RetryLater
from api.tenancy import admission
from backfill.platform.config import Settings
from backfill.tenancy.admission import ReserveRequest, ReserveResult


class _Temporal:
    """`answer(n)` decides the n-th update: a result, or an exception to raise after the RPC's
    whole timeout (an update no worker takes)."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.calls = 0
        self.released: list[str] = []
        self.in_flight = 0
        self.most_in_flight = 0

    async def execute_update_with_start_workflow(
        self, update: Any, req: ReserveRequest, *, rpc_timeout: timedelta, **_: Any
    ) -> ReserveResult:
        self.calls += 1
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            got = self.answer(self.calls)
            if isinstance(got, RPCError) and got.status == RPCStatusCode.DEADLINE_EXCEEDED:
                await asyncio.sleep(rpc_timeout.total_seconds())
            else:
                await asyncio.sleep(0.01)
            if isinstance(got, BaseException):
                raise got
            return got  # type: ignore[no-any-return]
        finally:
            self.in_flight -= 1

    def get_workflow_handle_for(self, run: Any, workflow_id: str) -> _Temporal:
        return self

    async def signal(self, signal: Any, req: Any) -> None:
        self.released.append(req.batch_id)


def _req(n: int) -> ReserveRequest:
    return ReserveRequest(
        batch_id=f"batch_{n}", input_file_id="file-a", input_bytes=1, lines=1, max_active_batches=5
    )


@pytest.fixture(autouse=True)
def _quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admission, "RESERVE_TIMEOUT", timedelta(seconds=0.5))


async def test_no_answer_is_a_503_and_the_waiting_creates_are_refused_at_once() -> None:
    unanswered = RPCError("no worker", RPCStatusCode.DEADLINE_EXCEEDED, b"")
    temporal = _Temporal(lambda n: unanswered)
    loop = asyncio.get_running_loop()
    started = loop.time()
    results = await asyncio.gather(
        *(admission.reserve(temporal, Settings(), "w", _req(n)) for n in range(12)),  # type: ignore[arg-type]
        return_exceptions=True,
    )
    took = loop.time() - started
    assert all(isinstance(r, RetryLater) for r in results), results
    assert all(r.headers == {"Retry-After": "10"} for r in results)  # type: ignore[union-attr]
    assert all(r.code == "admission_unavailable" and r.status == 503 for r in results)  # type: ignore[union-attr]
    # Only the first turn's 4 asked Temporal; the 8 behind them were refused without waiting.
    assert temporal.calls == admission.IN_FLIGHT_PER_WORKSPACE
    assert took < 2.0, took
    assert sorted(temporal.released) == sorted(f"batch_{n}" for n in range(4))


async def test_a_burst_waits_its_turn_and_rides_out_resource_exhausted() -> None:
    busy = RPCError("too many in-flight updates", RPCStatusCode.RESOURCE_EXHAUSTED, b"")
    ok = ReserveResult(accepted=True, active=1, lines=1)
    temporal = _Temporal(lambda n: busy if n % 3 == 0 else ok)
    await asyncio.gather(
        *(admission.reserve(temporal, Settings(), "w2", _req(n)) for n in range(30))  # type: ignore[arg-type]
    )
    assert temporal.most_in_flight <= admission.IN_FLIGHT_PER_WORKSPACE
    assert temporal.released == []
