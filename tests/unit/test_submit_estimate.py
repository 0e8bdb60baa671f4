"""The estimate at submit: the pure decision (`backfill.batches.submit_estimate`) and the api's
readers of the usage journal and the input's first line (`api.batches.submit_estimate`)."""

from __future__ import annotations

import json
from pathlib import Path

from api.batches.input_scan import scan_input
from api.batches.submit_estimate import REFRESH_SECONDS, ServedHistory, first_model
from backfill.batches.submit_estimate import (
    HOUR,
    WEEK_HOURS,
    RouteWork,
    Served,
    estimate,
    finish_at,
    hour_of_week,
    lines_ahead,
    pace_of,
    split_lines,
    weekly_profile,
)
from backfill.files import FileStore
from backfill.usage.journal import UsageEntry, hour_name

MONDAY = 4 * 86400  # 1970-01-05 00:00 UTC, a Monday
WEEK = WEEK_HOURS * HOUR
NOW = MONDAY + 10 * WEEK + 12 * HOUR  # a Monday, 12:00 UTC


def busy(lines: int, minutes: int = 60) -> Served:
    return Served(lines, minutes)


def nightly(lines_per_hour: int, weeks: int = 1) -> dict[int, Served]:
    """Served history of a route that served batches only from 00:00 to 06:00 UTC, busy all
    those hours."""
    start = NOW // HOUR * HOUR - weeks * WEEK
    return {h: busy(lines_per_hour) for h in range(start, NOW - HOUR, HOUR) if (h // HOUR) % 24 < 6}


def flat(lines_per_hour: int, weeks: int = 1) -> dict[int, Served]:
    """Every hour of the last `weeks` weeks (the current one excepted) busy at this rate."""
    current = NOW // HOUR * HOUR
    return {h: busy(lines_per_hour) for h in range(current - weeks * WEEK, current, HOUR)}


def test_hour_of_week_starts_monday_midnight_utc() -> None:
    assert hour_of_week(MONDAY) == 0
    assert hour_of_week(MONDAY - 1) == WEEK_HOURS - 1
    assert hour_of_week(0) == 72  # 1970-01-01 was a Thursday
    assert hour_of_week(NOW) == 12


def test_profile_takes_the_most_of_the_weeks_and_the_current_hour() -> None:
    hour = NOW // HOUR * HOUR
    served = {
        hour - WEEK: busy(5),  # this hour of the week, a week ago
        hour - 2 * WEEK: busy(9),  # two weeks ago: the most
        hour - 5 * WEEK: busy(50),  # older than the history
        hour - HOUR: busy(3),
    }
    profile = weekly_profile(served, NOW)
    assert profile[12] == 9
    assert profile[11] == 3
    assert sum(1 for p in profile if p is not None) == 2
    # The current hour so far counts: 7 lines in its first minute is 420 an hour.
    assert weekly_profile({**served, hour: busy(7, 1)}, NOW)[12] == 420
    assert not any(weekly_profile({hour - 5 * WEEK: busy(1)}, NOW))


def test_an_hour_reads_its_pace_while_serving_not_its_idle_minutes() -> None:
    """The 9-11x: a route that served a batch of 600 lines in 5 minutes of last week's hour
    serves 7,200 an hour, not 600: the same batch is expected in about 5 minutes, not an hour."""
    last_week = NOW // HOUR * HOUR - WEEK
    served = {last_week: busy(600, 5)}
    assert Served(600, 5).rate == 7200
    est = estimate([RouteWork("r", 600, (), served)], now=NOW, expires_at=NOW + 24 * HOUR)
    assert est.expected_finish_at == NOW + 5 * 60
    assert est.window_achievable is True


def test_a_fresh_route_is_estimated_from_the_lines_served_this_hour() -> None:
    """A route first served 10 minutes ago (100 lines in them): its pace now carries on, within
    the hour and after it, though no hour of the week has history."""
    hour = NOW // HOUR * HOUR
    served = {hour: busy(100, 10)}  # 600 an hour
    small = estimate([RouteWork("r", 60, (), served)], now=NOW, expires_at=NOW + 24 * HOUR)
    assert (small.expected_finish_at, small.window_achievable) == (NOW + 6 * 60, True)
    # 1,200 lines run into the next hours at the same pace.
    big = estimate([RouteWork("r", 1200, (), served)], now=NOW, expires_at=NOW + 24 * HOUR)
    assert (big.expected_finish_at, big.window_achievable) == (NOW + 2 * HOUR, True)
    # Its first hour ended: the next hour's batch still has its pace.
    later = NOW + HOUR + 60
    est = estimate([RouteWork("r", 60, (), served)], now=later, expires_at=later + 24 * HOUR)
    assert (est.expected_finish_at, est.window_achievable) == (later + 6 * 60, True)
    # The pace now alone never says a window is missed: no hour of the window has history.
    huge = estimate([RouteWork("r", 100_000, (), served)], now=NOW, expires_at=NOW + 24 * HOUR)
    assert huge.window_achievable is None
    assert huge.expected_finish_at is not None and huge.expected_finish_at > NOW + 24 * HOUR


def test_history_in_another_hour_of_the_week_is_unknown_not_a_miss() -> None:
    """Served only three days ago at 09:00: a batch created now (12:00, Monday), with a 24 h
    window, is not said to finish next week nor to miss its window."""
    three_days_ago = NOW // HOUR * HOUR - 3 * 24 * HOUR - 3 * HOUR
    served = {three_days_ago: busy(50, 2)}
    est = estimate([RouteWork("r", 10, (), served)], now=NOW, expires_at=NOW + 24 * HOUR)
    assert (est.expected_finish_at, est.window_achievable) == (None, None)


def test_lines_ahead_shares_fairly() -> None:
    # A new batch of 10 lines waits for at most 10 of each batch already there.
    assert lines_ahead(10, [3, 40, 0]) == 13
    assert lines_ahead(10, []) == 0


def test_finish_walks_a_nightly_route_through_the_day() -> None:
    pace = pace_of(nightly(10), NOW)
    # Submitted Monday 12:00: nothing served until 00:00, then 10 an hour.
    assert finish_at(30, pace, NOW, NOW + WEEK).finish == MONDAY + 10 * WEEK + 27 * HOUR
    assert finish_at(65, pace, NOW, NOW + WEEK).finish == MONDAY + 10 * WEEK + 48 * HOUR + 30 * 60
    assert finish_at(10_000, pace, NOW, NOW + WEEK).finish is None


def test_a_24h_window_on_a_nightly_route() -> None:
    expires = NOW + 24 * HOUR
    fits = estimate([RouteWork("r", 60, (), nightly(10))], now=NOW, expires_at=expires)
    assert fits.window_achievable is True
    assert fits.expected_finish_at == MONDAY + 10 * WEEK + 30 * HOUR
    # One more line runs into the next night, but no history says what the day hours of its
    # window can serve: not known, and no finish (it was walked over hours without a pace).
    late = estimate([RouteWork("r", 61, (), nightly(10))], now=NOW, expires_at=expires)
    assert (late.expected_finish_at, late.window_achievable) == (None, None)
    # The same 30 lines behind a batch wanting 40: 30 of its lines come before it finishes.
    queued = estimate([RouteWork("r", 30, (40,), nightly(10))], now=NOW, expires_at=expires)
    assert queued.lines_ahead == 30
    assert queued.expected_finish_at == MONDAY + 10 * WEEK + 30 * HOUR


def test_a_miss_is_said_when_every_hour_of_the_window_has_history() -> None:
    expires = NOW + 24 * HOUR
    late = estimate([RouteWork("r", 2500, (), flat(100))], now=NOW, expires_at=expires)
    assert (late.expected_finish_at, late.window_achievable) == (NOW + 25 * HOUR, False)
    fits = estimate([RouteWork("r", 2400, (), flat(100))], now=NOW, expires_at=expires)
    assert (fits.expected_finish_at, fits.window_achievable) == (expires, True)


def test_no_history_no_estimate() -> None:
    none = estimate([RouteWork("r", 5, (), {})], now=NOW, expires_at=NOW + 24 * HOUR)
    assert (none.expected_finish_at, none.window_achievable) == (None, None)
    # Too much work to finish within the horizon, every hour seen: no time, the window missed.
    far = estimate([RouteWork("r", 10**9, (), flat(1))], now=NOW, expires_at=NOW + 24 * HOUR)
    assert (far.expected_finish_at, far.window_achievable) == (None, False)


def test_the_latest_route_decides() -> None:
    routes = [RouteWork("fast", 50, (), flat(100)), RouteWork("night", 50, (), nightly(10))]
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
    """Lines and the minutes they ended in, per route and hour, over every process's files;
    the current hour so far included."""
    usage = tmp_path / "usage"
    usage.mkdir()
    now = NOW + 30 * 60
    cur = now // HOUR * HOUR
    h1, h2 = cur - 2 * HOUR, cur - HOUR
    (usage / f"{hour_name(h1)}.a.jsonl").write_bytes(
        _entry(h1 + 1, "r1") + _entry(h1 + 2, "r1", "429") + _entry(h1 + 3, "r1", cls="live")
    )
    (usage / f"{hour_name(h2)}.a.jsonl").write_bytes(_entry(h2 + 1, "r1") + _entry(h2 + 1, "r2"))
    # Another process's file: one more line in the same minute, one a minute later.
    (usage / f"{hour_name(h2)}.b.jsonl").write_bytes(
        _entry(h2 + 5, "r1") + _entry(h2 + 61, "r1") + b'{"torn'
    )
    (usage / f"{hour_name(cur)}.a.jsonl").write_bytes(_entry(cur + 60, "r1"))
    history = ServedHistory(tmp_path)
    r1 = {h1: Served(1, 1), h2: Served(3, 2), cur: Served(1, 1)}
    assert history.served(now) == {"r1": r1, "r2": {h2: Served(1, 1)}}
    # A file that grew is read again at the next look, a minute on.
    with (usage / f"{hour_name(h2)}.a.jsonl").open("ab") as f:
        f.write(_entry(h2 + 9 * 60, "r2"))
    assert history.served(now + 30)["r2"] == {h2: Served(1, 1)}
    assert history.served(now + REFRESH_SECONDS)["r2"] == {h2: Served(2, 2)}
    # A file pruned or added (another process's first entry of an hour) shows at once.
    (usage / f"{hour_name(h1)}.a.jsonl").unlink()
    assert h1 not in history.served(now + REFRESH_SECONDS + 1)["r1"]
    (usage / f"{hour_name(h1)}.c.jsonl").write_bytes(_entry(h1 + 1, "r3"))
    assert history.served(now + REFRESH_SECONDS + 2)["r3"] == {h1: Served(1, 1)}


def test_first_model_reads_only_the_first_request_line(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions"}
    body = "\n".join(
        json.dumps({**line, "body": {"model": m, "messages": []}}) for m in ("demo", "other")
    )
    head = scan_input(store, _upload(store, "\n\n" + body)).head
    assert first_model(head, "/v1/chat/completions") == "demo"
    head = scan_input(store, _upload(store, "not json\n")).head
    assert first_model(head, "/v1/chat/completions") is None


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
    from backfill.batches.batch import Batch, SubmitEstimate
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
    assert "none (not enough throughput history on its route)" in page()
    assert cli() == "none (not enough throughput history on its route); 0 lines queued before it"
    # The pace now says late, but no hour of the window has history: no verdict.
    batch.backfill.estimate = SubmitEstimate(made_at=1, expected_finish_at=90000, lines=9)
    unknown = "window not known (no history for some of its hours)"
    assert unknown in page() and "likely to miss" not in page()
    assert cli() == (
        "expected to finish 1970-01-02 01:00:00 UTC at the route's pace now, " + unknown + "; "
        "0 lines queued before it"
    )


async def test_a_route_without_history_asks_no_scheduler(tmp_path: Path) -> None:
    """No history, no estimate: the create does not wait for a scheduler's answer (none may be
    running) to give nulls."""
    from typing import Any, cast

    from temporalio.client import Client

    from api.batches.submit_estimate import estimate_at_submit
    from backfill.platform.config import Settings

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
        history=ServedHistory(tmp_path),
        first_line=scan_input(store, _upload(store, text)).head,
        endpoint="/v1/chat/completions",
        lines=1,
        now=NOW,
        expires_at=NOW + 86400,
    )
    assert est.model == "demo" and est.lines == 1
    assert (est.expected_finish_at, est.window_achievable) == (None, None)
    assert used == []
