"""The estimate at submit: the pure decision (`backfill.submit_estimate`) and the api's readers
of the usage journal and the input's first line (`api.submit_estimate`)."""

from __future__ import annotations

import json
from pathlib import Path

from api.submit_estimate import REFRESH_SECONDS, ServedHistory, first_model
from backfill.store import FileStore
from backfill.submit_estimate import (
    HOUR,
    WEEK_HOURS,
    RouteWork,
    estimate,
    finish_at,
    hour_of_week,
    lines_ahead,
    split_lines,
    weekly_profile,
)
from backfill.usage import UsageEntry, hour_name

MONDAY = 4 * 86400  # 1970-01-05 00:00 UTC, a Monday
WEEK = WEEK_HOURS * HOUR
NOW = MONDAY + 10 * WEEK + 12 * HOUR  # a Monday, 12:00 UTC


def nightly(lines_per_hour: int, weeks: int = 1) -> dict[int, int]:
    """Served history of a route that served batches only from 00:00 to 06:00 UTC."""
    start = NOW // HOUR * HOUR - weeks * WEEK
    return {h: lines_per_hour for h in range(start, NOW - HOUR, HOUR) if (h // HOUR) % 24 < 6}


def test_hour_of_week_starts_monday_midnight_utc() -> None:
    assert hour_of_week(MONDAY) == 0
    assert hour_of_week(MONDAY - 1) == WEEK_HOURS - 1
    assert hour_of_week(0) == 72  # 1970-01-01 was a Thursday
    assert hour_of_week(NOW) == 12


def test_profile_takes_the_most_of_the_weeks_and_only_ended_hours() -> None:
    hour = NOW // HOUR * HOUR
    served = {
        hour - WEEK: 5,  # this hour of the week, a week ago
        hour - 2 * WEEK: 9,  # two weeks ago: the most
        hour - 5 * WEEK: 50,  # older than the history
        hour: 70,  # the current hour has not ended
        hour - HOUR: 3,
    }
    profile = weekly_profile(served, NOW)
    assert profile is not None
    assert profile[12] == 9
    assert profile[11] == 3
    assert sum(profile) == 12
    assert weekly_profile({hour: 70, hour - 5 * WEEK: 1}, NOW) is None


def test_lines_ahead_shares_fairly() -> None:
    # A new batch of 10 lines waits for at most 10 of each batch already there.
    assert lines_ahead(10, [3, 40, 0]) == 13
    assert lines_ahead(10, []) == 0


def test_finish_walks_a_nightly_route_through_the_day() -> None:
    profile = weekly_profile(nightly(10), NOW)
    assert profile is not None
    # Submitted Monday 12:00: nothing served until 00:00, then 10 an hour.
    assert finish_at(30, profile, NOW, NOW + WEEK) == MONDAY + 10 * WEEK + 27 * HOUR
    assert finish_at(65, profile, NOW, NOW + WEEK) == MONDAY + 10 * WEEK + 48 * HOUR + 30 * 60
    assert finish_at(10_000, profile, NOW, NOW + WEEK) is None


def test_a_24h_window_on_a_nightly_route() -> None:
    expires = NOW + 24 * HOUR
    fits = estimate([RouteWork("r", 60, (), nightly(10))], now=NOW, expires_at=expires)
    assert fits.window_achievable is True
    assert fits.expected_finish_at == MONDAY + 10 * WEEK + 30 * HOUR
    # One more line runs into the next night: the window is missed.
    late = estimate([RouteWork("r", 61, (), nightly(10))], now=NOW, expires_at=expires)
    assert late.window_achievable is False
    assert late.expected_finish_at is not None and late.expected_finish_at > expires
    # The same 30 lines behind a batch wanting 40: 30 of its lines come before it finishes.
    queued = estimate([RouteWork("r", 30, (40,), nightly(10))], now=NOW, expires_at=expires)
    assert queued.lines_ahead == 30
    assert queued.expected_finish_at == MONDAY + 10 * WEEK + 30 * HOUR


def test_no_history_no_estimate() -> None:
    none = estimate([RouteWork("r", 5, (), {})], now=NOW, expires_at=NOW + 24 * HOUR)
    assert (none.expected_finish_at, none.window_achievable) == (None, None)
    # Too much work to finish within the horizon: no time, but the window is missed.
    far = estimate([RouteWork("r", 10**9, (), nightly(1))], now=NOW, expires_at=NOW + 24 * HOUR)
    assert (far.expected_finish_at, far.window_achievable) == (None, False)


def test_the_latest_route_decides() -> None:
    flat = {h: 100 for h in range(NOW // HOUR * HOUR - WEEK, NOW // HOUR * HOUR, HOUR)}
    routes = [RouteWork("fast", 50, (), flat), RouteWork("night", 50, (), nightly(10))]
    est = estimate(routes, now=NOW, expires_at=NOW + 24 * HOUR)
    assert est.expected_finish_at == MONDAY + 10 * WEEK + 29 * HOUR


def test_split_lines_by_weight() -> None:
    assert split_lines(10, [1, 1, 1]) in ([4, 3, 3], [3, 4, 3], [3, 3, 4])
    assert sum(split_lines(7, [3, 1])) == 7
    assert split_lines(7, [3, 1]) == [5, 2]


def _entry(at: float, route: str, status: str = "200", cls: str = "batch") -> bytes:
    e = UsageEntry(
        at=at,
        request_id="r",
        workspace="w",
        key_id=None,
        model="m",
        route=route,
        service_class=cls,  # type: ignore[arg-type]
        status=status,
    )
    return e.to_line()


def test_served_history_counts_batch_lines_answered_200_per_route_and_hour(
    tmp_path: Path,
) -> None:
    usage = tmp_path / "usage"
    usage.mkdir()
    now = NOW
    h1, h2 = now // HOUR * HOUR - 2 * HOUR, now // HOUR * HOUR - HOUR
    (usage / f"{hour_name(h1)}.a.jsonl").write_bytes(
        _entry(h1 + 1, "r1") + _entry(h1 + 2, "r1", "429") + _entry(h1 + 3, "r1", cls="live")
    )
    (usage / f"{hour_name(h2)}.a.jsonl").write_bytes(_entry(h2 + 1, "r1") + _entry(h2 + 1, "r2"))
    (usage / f"{hour_name(h2)}.b.jsonl").write_bytes(_entry(h2 + 5, "r1") + b'{"torn')
    (usage / f"{hour_name(now // HOUR * HOUR)}.a.jsonl").write_bytes(_entry(now, "r1"))
    history = ServedHistory(tmp_path)
    assert history.served(now) == {"r1": {h1: 1, h2: 2}, "r2": {h2: 1}}
    # A file that grew is read again at the next look, a minute on.
    with (usage / f"{hour_name(h2)}.a.jsonl").open("ab") as f:
        f.write(_entry(h2 + 9, "r2"))
    assert history.served(now + 30) == {"r1": {h1: 1, h2: 2}, "r2": {h2: 1}}
    assert history.served(now + REFRESH_SECONDS) == {"r1": {h1: 1, h2: 2}, "r2": {h2: 2}}
    # A file pruned or added (another process's first entry of an hour) shows at once.
    (usage / f"{hour_name(h1)}.a.jsonl").unlink()
    assert history.served(now + REFRESH_SECONDS + 1) == {"r1": {h2: 2}, "r2": {h2: 2}}
    (usage / f"{hour_name(h1)}.c.jsonl").write_bytes(_entry(h1 + 1, "r3"))
    assert history.served(now + REFRESH_SECONDS + 2)["r3"] == {h1: 1}


def test_first_model_reads_only_the_first_request_line(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions"}
    body = "\n".join(
        json.dumps({**line, "body": {"model": m, "messages": []}}) for m in ("demo", "other")
    )
    assert first_model(store, _upload(store, "\n\n" + body), "/v1/chat/completions") == "demo"
    assert first_model(store, _upload(store, "not json\n"), "/v1/chat/completions") is None


def _upload(store: FileStore, text: str) -> str:
    up = store.begin_upload(1 << 20)
    up.write(text.encode())
    return up.finish(workspace="w", filename="in.jsonl", purpose="batch").id


def test_the_cli_and_the_console_say_the_estimate() -> None:
    from starlette.requests import Request

    from api.console.batch_pages import actions, why_it_waits
    from api.console.sessions import SessionTable
    from api.console.web import templates
    from api.deps import Identity
    from backfill.batches import Batch, SubmitEstimate
    from tools.client.wording import estimate_line

    batch = Batch(
        id="batch_x",
        endpoint="/v1/chat/completions",
        input_file_id="file-x",
        completion_window="24h",
        status="in_progress",
        created_at=1,
        expires_at=86401,
    )
    who = Identity(workspace="w", role="member", key_id="k", key_name="alice")
    session = SessionTable().create(who, now=0)
    request = Request({"type": "http", "query_string": b"", "headers": [], "path": "/"})

    def page() -> str:
        return templates.get_template("batch.html").render(
            request=request,
            session=session,
            identity=who,
            batch=batch,
            now=2,
            actions=actions(batch, "member"),
            why=why_it_waits(batch),
        )

    def cli() -> str | None:
        return estimate_line(batch.model_dump()["backfill"])

    assert 'id="estimate"' not in page() and cli() is None  # a batch from before: no row
    batch.backfill.estimate = SubmitEstimate(
        made_at=1, expected_finish_at=90000, window_achievable=False, lines=9, lines_ahead=4
    )
    assert "likely to miss its window" in page() and "1970-01-02 01:00:00 UTC" in page()
    assert cli() == (
        "expected to finish 1970-01-02 01:00:00 UTC, LIKELY TO MISS its window; "
        "4 lines queued before it"
    )
    batch.backfill.estimate = SubmitEstimate(made_at=1, lines=9)
    assert "no throughput history" in page()
    assert cli() == "none (no throughput history on its route); 0 lines queued before it"


async def test_a_route_without_history_asks_no_scheduler(tmp_path: Path) -> None:
    """No history, no estimate: the create does not wait for a scheduler's answer (none may be
    running) to give nulls."""
    from typing import Any, cast

    from temporalio.client import Client

    from api.submit_estimate import estimate_at_submit
    from backfill.config import Settings

    used: list[str] = []

    class NoCalls:  # what it is asked is recorded (the estimate swallows any error)
        def __getattr__(self, name: str) -> Any:
            used.append(name)
            raise AssertionError(f"the client was used: {name}")

    store = FileStore(tmp_path)
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions"}
    text = json.dumps({**line, "body": {"model": "demo", "messages": []}}) + "\n"
    settings = Settings(
        models=[{"id": "demo", "routes": [{"id": "r1", "base_url": "http://upstream/v1"}]}]
    )
    est = await estimate_at_submit(
        client=cast(Client, NoCalls()),
        settings=settings,
        store=store,
        history=ServedHistory(tmp_path),
        file_id=_upload(store, text),
        endpoint="/v1/chat/completions",
        lines=1,
        now=NOW,
        expires_at=NOW + 86400,
    )
    assert est.model == "demo" and est.lines == 1
    assert (est.expected_finish_at, est.window_achievable) == (None, None)
    assert used == []
