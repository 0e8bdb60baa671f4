"""The usage journal (backfill.usage.journal): append, read back across hours, files and processes,
hourly totals; and what the line activity and the live proxy's reader journal."""

from __future__ import annotations

import json
import multiprocessing
import time
from pathlib import Path

import httpx
from prometheus_client import REGISTRY

from api.live.usage_counts import UsageReader
from backfill.usage.journal import (
    HOUR,
    USAGE_DIR,
    UsageEntry,
    UsageJournal,
    UsageTotal,
    hour_name,
    hourly_totals,
    prune_journal,
    read_entries,
)
from tests.unit.test_run_line import BATCH, OK_BODY, line, make, run

T0 = 1_790_000_000 // HOUR * HOUR
"""Start of some hour."""


def entry(at: float, ws: str = "w", cls: str = "batch", p: int = 3, c: int = 2) -> UsageEntry:
    return UsageEntry(
        at=at,
        request_id=f"req_{at}",
        workspace=ws,
        key_id="k1",
        model="demo",
        route="r1",
        service_class=cls,  # type: ignore[arg-type]
        status="200",
        prompt_tokens=p,
        completion_tokens=c,
    )


def test_entries_are_read_back_across_hours_and_ranges(tmp_path: Path) -> None:
    journal = UsageJournal(tmp_path, process="p1", flush_seconds=60)
    written = [entry(T0 + 1), entry(T0 + HOUR - 1), entry(T0 + HOUR + 5, cls="live")]
    for e in written:
        journal.record(e)
    assert list(read_entries(tmp_path)) == []  # buffered until flushed
    journal.close()
    assert sorted(p.name for p in (tmp_path / USAGE_DIR).iterdir()) == [
        f"{hour_name(T0)}.p1.jsonl",
        f"{hour_name(T0 + HOUR)}.p1.jsonl",
    ]
    assert sorted(read_entries(tmp_path), key=lambda e: e.at) == written
    assert list(read_entries(tmp_path, T0 + 2, T0 + HOUR + 5)) == [written[1]]
    assert list(read_entries(tmp_path, T0 + HOUR)) == [written[2]]


def _write_in_process(root: str, name: str, n: int) -> None:
    journal = UsageJournal(Path(root), process=name, flush_seconds=60)
    for i in range(n):
        journal.record(entry(T0 + i, ws=name))
    journal.close()


def test_several_processes_write_their_own_files_and_a_reader_sums_them(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(target=_write_in_process, args=(str(tmp_path), f"p{i}", 5)) for i in range(3)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert len(list((tmp_path / USAGE_DIR).glob("*.jsonl"))) == 3
    totals = hourly_totals(read_entries(tmp_path))
    assert totals == [
        UsageTotal(T0, f"p{i}", "demo", "batch", requests=5, prompt_tokens=15, completion_tokens=10)
        for i in range(3)
    ]


def test_a_torn_last_line_is_skipped_and_appends_continue_after_a_restart(tmp_path: Path) -> None:
    first = UsageJournal(tmp_path, process="p1")
    first.record(entry(T0 + 1))
    first.close()
    path = next((tmp_path / USAGE_DIR).glob("*.jsonl"))
    with path.open("ab") as f:
        f.write(b'{"at": 17')  # a process died mid-write
    again = UsageJournal(tmp_path, process="p1")  # the same name after a restart: appends
    again.record(entry(T0 + 2))
    again.close()
    assert [e.at for e in read_entries(tmp_path)] == [T0 + 1, T0 + 2]
    assert path.read_bytes().count(b"\n") == 3  # the torn line ended, then skipped on reading


def test_hourly_totals_group_by_hour_workspace_model_and_class() -> None:
    entries = [
        entry(T0 + 1, "a", "batch", 1, 10),
        entry(T0 + 2, "a", "batch", 2, 20),
        entry(T0 + 3, "a", "live", 4, 40),
        entry(T0 + HOUR, "a", "batch", 8, 80),
        entry(T0 + 4, "b", "batch", 16, 160),
    ]
    assert hourly_totals(entries) == [
        UsageTotal(T0, "a", "demo", "batch", 2, 3, 30),
        UsageTotal(T0, "a", "demo", "live", 1, 4, 40),
        UsageTotal(T0, "b", "demo", "batch", 1, 16, 160),
        UsageTotal(T0 + HOUR, "a", "demo", "batch", 1, 8, 80),
    ]
    assert hourly_totals(entries, workspace="b") == [
        UsageTotal(T0, "b", "demo", "batch", 1, 16, 160)
    ]


def test_record_counts_prometheus_counters(tmp_path: Path) -> None:
    labels = {"workspace": "prom-ws", "model": "demo", "service_class": "live"}

    def value(name: str, **extra: str) -> float:
        return REGISTRY.get_sample_value(name, {**labels, **extra}) or 0.0

    before = [value("gateway_usage_requests_total")] + [
        value("gateway_usage_tokens_total", kind=k) for k in ("prompt", "completion")
    ]
    journal = UsageJournal(tmp_path, flush_seconds=60)
    journal.record(entry(T0, "prom-ws", "live", 5, 7))
    journal.record(entry(T0 + 1, "prom-ws", "live", 1, 0))
    journal.close()
    after = [value("gateway_usage_requests_total")] + [
        value("gateway_usage_tokens_total", kind=k) for k in ("prompt", "completion")
    ]
    assert [a - b for a, b in zip(after, before, strict=True)] == [2, 6, 7]


def test_every_line_attempt_is_journaled_with_its_own_request_id(tmp_path: Path) -> None:
    answers = iter([httpx.Response(429), httpx.Response(200, json=OK_BODY)])
    seen: list[httpx.Request] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        return next(answers)

    acts, file_id, store = make(tmp_path, handler)
    acts.usage = UsageJournal(tmp_path, process="w1", flush_seconds=60)
    snapshot = {"workspace": "ws-a", "key_id": "key_1"}
    assert run(acts, line(file_id, final=False).model_copy(update=snapshot)).retry
    assert run(acts, line(file_id).model_copy(update=snapshot)).ok
    # A line given up on (lost, expired) is never sent and costs nothing.
    give_up = {**snapshot, "give_up_code": "line_lost", "give_up_message": "m"}
    run(acts, line(file_id, position=1).model_copy(update=give_up))
    acts.usage.close()
    got = sorted(read_entries(tmp_path), key=lambda e: e.at)
    sent = [r.headers["X-Request-ID"] for r in seen]
    assert len(sent) == 2 and len(set(sent)) == 2
    assert [(e.request_id, e.status, e.prompt_tokens, e.completion_tokens) for e in got] == [
        (sent[0], "429", 0, 0),
        (sent[1], "200", 3, 2),
    ]
    assert {
        (e.workspace, e.key_id, e.model, e.route, e.service_class, e.batch_id) for e in got
    } == {("ws-a", "key_1", "demo", "r1", "batch", BATCH)}
    assert json.loads(store.get_result(BATCH, 0) or b"{}")["response"]["request_id"] == sent[1]


def test_the_live_reader_finds_usage_in_json_and_in_a_stream() -> None:
    body = json.dumps({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 11}})
    reader = UsageReader("application/json")
    for i in range(0, len(body), 5):
        reader.feed(body[i : i + 5].encode())
    assert reader.tokens() == (7, 11)
    events = [
        {"choices": [{"delta": {"content": "a"}}], "usage": None},
        {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 9}},
    ]
    sse = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    stream = UsageReader("text/event-stream; charset=utf-8")
    for i in range(0, len(sse), 7):
        stream.feed(sse[i : i + 7].encode())
    assert stream.tokens() == (4, 9)
    no_usage = UsageReader("text/event-stream")
    no_usage.feed(f"data: {json.dumps(events[0])}\n\ndata: [DONE]\n\n".encode())
    assert no_usage.tokens() == (0, 0)


def test_a_field_added_by_a_newer_writer_does_not_hide_the_entry(tmp_path: Path) -> None:
    (tmp_path / USAGE_DIR).mkdir()
    newer = {**json.loads(entry(T0 + 1).to_line()), "cached_tokens": 4}
    (tmp_path / USAGE_DIR / f"{hour_name(T0)}.p9.jsonl").write_text(json.dumps(newer) + "\n")
    assert list(read_entries(tmp_path)) == [entry(T0 + 1)]


def test_hours_past_the_retention_bound_are_pruned_and_every_hour_within_it_kept(
    tmp_path: Path,
) -> None:
    """By every journaling process, when it starts (and hourly): the files of hours that ended
    more than `retention_days` ago go, whichever process wrote them; the usage API's totals of
    every hour within the bound stay whole."""
    day = 24 * HOUR
    this_hour = int(time.time()) // HOUR * HOUR
    hours = [this_hour - 401 * day, this_hour - 399 * day, this_hour]
    old = UsageJournal(tmp_path, process="old", flush_seconds=60)
    for hour in hours:
        old.record(entry(hour + 1))
    old.close()
    journal = UsageJournal(tmp_path, process="new", flush_seconds=60, retention_days=400)
    journal.close()  # its thread pruned first
    assert sorted(p.name for p in (tmp_path / USAGE_DIR).iterdir()) == [
        f"{hour_name(h)}.old.jsonl" for h in hours[1:]
    ]
    assert [t.hour for t in hourly_totals(read_entries(tmp_path))] == hours[1:]
    # An hour goes once it has wholly ended before the bound, not before.
    kept = hours[1]
    assert prune_journal(tmp_path, kept + HOUR - 1) == 0
    assert prune_journal(tmp_path, kept + HOUR) == 1
    assert [t.hour for t in hourly_totals(read_entries(tmp_path))] == [this_hour]
