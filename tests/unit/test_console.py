"""The console's pure parts: sessions, the form <-> settings document mapping, the charts."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError
from starlette.datastructures import FormData

from api.app import create_app
from api.console.charts import bar_chart, route_chart
from api.console.route_pages import field_errors, form_values, posted_values, settings_document
from api.console.samples import WINDOW_SECONDS, RouteSample, RouteSamples
from api.console.sessions import IDLE_SECONDS, MAX_AGE_SECONDS, SessionsFull, SessionTable
from api.console.usage_page import daily_rows
from api.deps import Identity
from api.schemas import BatchScheduling, PreemptChannelStatus, SchedulingStatus
from backfill.platform.config import ApiKeyConfig, Settings, hash_key
from backfill.routes.settings import RouteSettings
from backfill.usage.journal import UsageTotal

ALICE = Identity(workspace="alice", role="member", key_name="alice")


def test_sessions_expire_when_idle_or_old_and_sign_out_ends_them() -> None:
    table = SessionTable()
    s = table.create(ALICE, now=0)
    assert len(s.id) >= 40 and s.csrf_token != s.id
    assert table.get(s.id, now=IDLE_SECONDS - 1) is s  # use restarts the idle clock
    assert table.get(s.id, now=2 * IDLE_SECONDS - 2) is s
    assert table.get(s.id, now=MAX_AGE_SECONDS + 1) is None  # too old, however used
    idle = table.create(ALICE, now=0)
    assert table.get(idle.id, now=IDLE_SECONDS + 1) is None
    out = table.create(ALICE, now=0)
    table.drop(out.id)
    assert table.get(out.id, now=1) is None
    assert table.get(None, now=1) is None and table.get("forged", now=1) is None


def test_csrf_tokens_compare_exactly_and_the_table_is_bounded() -> None:
    table = SessionTable(per_key=2)
    first = table.create(ALICE, now=0)
    assert first.csrf_ok(first.csrf_token)
    assert not first.csrf_ok(None) and not first.csrf_ok("") and not first.csrf_ok("x")
    table.create(ALICE, now=1)
    table.create(ALICE, now=2)
    assert len(table.sessions) == 2 and table.get(first.id, now=3) is None


def test_one_key_cannot_sign_everyone_else_out() -> None:
    """A key signing in over and over ends only its own oldest sessions; when the table is
    full, new sign-ins are refused and every existing session stays."""
    bob = Identity(workspace="bob", role="member", key_name="bob", key_id="key_bob")
    mallory = Identity(workspace="m", role="member", key_name="m", key_id="key_m")
    table = SessionTable(limit=30, per_key=20)
    bobs = [table.create(bob, now=i) for i in range(5)]
    mine = [table.create(mallory, now=10 + i) for i in range(100)]
    assert all(table.get(s.id, now=200) is s for s in bobs)
    live = [s for s in mine if table.get(s.id, now=200) is not None]
    assert live == mine[-20:]
    others = [
        Identity(workspace="w", role="member", key_name=f"k{i}", key_id=f"k{i}") for i in range(10)
    ]
    for who in others[:5]:
        table.create(who, now=300)
    with pytest.raises(SessionsFull):
        table.create(others[5], now=301)
    assert all(table.get(s.id, now=302) is s for s in bobs)


def form(pairs: list[tuple[str, str]]) -> FormData:
    return FormData([("csrf_token", "t"), *pairs])


def test_a_blank_gate_is_off_and_the_document_validates_like_the_api() -> None:
    values = posted_values(form([("max_concurrent_lines", "8"), ("priority_hint", "")]))
    doc = settings_document(values)
    assert RouteSettings.model_validate(doc) == RouteSettings(max_concurrent_lines=8)
    full = posted_values(
        form(
            [
                ("max_concurrent_lines", "4"),
                ("yield_to_live_traffic.pause_at_in_flight", "2"),
                ("server_load.metrics_url", "http://h:8100/metrics"),
                ("server_load.max_waiting", "0"),
                ("time_window.time_zone", "Europe/Berlin"),
                ("time_window.days", "mon"),
                ("time_window.days", "fri"),
                ("time_window.from", "19:00"),
                ("time_window.until", "07:00"),
                ("reopen_ramp.initial", "2"),
                ("reopen_ramp.double_every_s", "1.5"),
                ("priority_hint", "10"),
            ]
        )
    )
    parsed = RouteSettings.model_validate(settings_document(full))
    assert parsed.server_load is not None and parsed.server_load.max_waiting == 0
    assert parsed.time_window is not None and parsed.time_window.days == ["mon", "fri"]
    assert parsed.model_dump()["reopen_ramp"] == {"initial": 2, "double_every_s": 1.5}
    # And back: the form shows what was saved.
    shown = form_values(parsed)
    assert {k: v for k, v in shown.items() if v} == {
        k: v for k, v in full.items() if v and k != "server_load.max_waiting"
    } | {"server_load.max_waiting": "0"}


@pytest.mark.parametrize(
    ("pairs", "field"),
    [
        ([("max_concurrent_lines", "500")], "max_concurrent_lines"),
        ([("max_concurrent_lines", "many")], "max_concurrent_lines"),
        ([("max_concurrent_lines", "2"), ("priority_hint", "0")], "priority_hint"),
        ([("max_concurrent_lines", "2"), ("time_window.from", "25:00")], "time_window.from"),
        (
            [("max_concurrent_lines", "2"), ("server_load.metrics_url", "http://h/metrics")],
            "server_load",
        ),
        (
            [("max_concurrent_lines", "2"), ("server_load.max_waiting", "1")],
            "server_load.metrics_url",
        ),
    ],
)
def test_validation_errors_name_their_form_field(pairs: list[tuple[str, str]], field: str) -> None:
    with pytest.raises(ValidationError) as err:
        RouteSettings.model_validate(settings_document(posted_values(form(pairs))))
    assert field in field_errors(err.value)


def test_samples_are_kept_for_fifteen_minutes() -> None:
    samples = RouteSamples()
    samples.add("r", RouteSample(100, 1, 4, 0))
    samples.add("r", RouteSample(200, 2, 4, 1))
    assert [s.at for s in samples.recent("r", now=150)] == [100, 200]
    assert [s.at for s in samples.recent("r", now=100 + WINDOW_SECONDS + 1)] == [200]
    assert samples.recent("other", now=0) == []


def test_route_chart_scales_to_the_peak_and_ends_at_now() -> None:
    chart = route_chart([RouteSample(0, 2, 8, 1), RouteSample(60, 8, 8, 3)], now=60)
    assert chart.y_max == 10 and chart.span_seconds == 60
    by_name = {line.name: line for line in chart.lines}
    assert by_name["running"].last == 8 and by_name["live"].last == 3
    first, last = by_name["running"].points.split()
    assert float(first.split(",")[0]) == chart.left and float(last.split(",")[0]) == chart.right_x
    assert route_chart([], now=0).lines[0].points == ""


def test_bar_chart_heights_are_proportional() -> None:
    chart = bar_chart([("a", {"batch": 50, "live": 100}), ("b", {})], ["batch", "live"])
    heights = {(b.group, b.series): b.h for b in chart.bars}
    assert chart.y_max == 100
    assert heights[("a", "batch")] * 2 == pytest.approx(heights[("a", "live")])
    assert heights[("b", "batch")] == heights[("b", "live")] == 0


def test_usage_rows_sum_models_per_day() -> None:
    day = 86400 * 20000
    buckets = [
        UsageTotal(
            hour=day + h * 3600,
            workspace="w",
            model=m,
            service_class="batch",
            requests=1,
            prompt_tokens=2,
            completion_tokens=3,
        )
        for h in (0, 5)
        for m in ("a", "b")
    ]
    (row,) = daily_rows(buckets)
    assert (row.requests, row.total_tokens) == (4, 20)


# ---- sign-in and CSRF without Temporal (FastAPI's in-process client) ---------------------------


@pytest.fixture
def http(tmp_path: Path) -> Iterator[TestClient]:
    settings = Settings(
        data_dir=tmp_path,
        api_keys=[ApiKeyConfig(sha256=hash_key(KEY), workspace="unit", name="unit-key")],
    )
    app = create_app(settings, client=object())  # type: ignore[arg-type]
    with TestClient(app, follow_redirects=False) as c:
        yield c


KEY = "sk-unit-console"
TOKEN = re.compile(r'name="csrf_token" value="([^"]+)"')


def token_of(html: str) -> str:
    found = TOKEN.search(html)
    assert found is not None
    return found.group(1)


def test_sign_in_needs_its_token_and_keeps_the_key_out_of_the_cookie(
    http: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    assert http.get("/console/batches").headers["location"] == "/console/sign-in"
    form = http.get("/console/sign-in")
    assert "default-src 'self'" in form.headers["content-security-policy"]
    token = token_of(form.text)
    assert http.post("/console/sign-in", data={"api_key": KEY}).status_code == 403
    wrong = http.post("/console/sign-in", data={"api_key": "sk-wrong", "csrf_token": token})
    assert wrong.status_code == 401 and "Incorrect API key." in wrong.text
    token = token_of(wrong.text)
    ok = http.post("/console/sign-in", data={"api_key": KEY, "csrf_token": token})
    assert ok.status_code == 303 and ok.headers["location"] == "/console/batches"
    cookie = next(c for c in ok.headers.get_list("set-cookie") if "backfill_console=" in c)
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/console" in cookie
    assert KEY not in cookie and KEY not in caplog.text
    # Signed in: a page renders; sign-out needs the session's token.
    usage = http.get("/console/usage")
    assert usage.status_code == 200 and "unit-key · unit · member" in usage.text
    assert http.post("/console/sign-out", data={}).status_code == 403
    out = http.post("/console/sign-out", data={"csrf_token": token_of(usage.text)})
    assert out.status_code == 303
    assert http.get("/console/usage").headers["location"] == "/console/sign-in"


def test_unknown_console_pages_are_html_404s_and_static_files_are_served(
    http: TestClient,
) -> None:
    missing = http.get("/console/no-such-page")
    assert missing.status_code == 404 and missing.headers["content-type"].startswith("text/html")
    assert http.get("/console/static/console.js").status_code == 200
    assert http.get("/console/static/console.css").status_code == 200


def test_what_users_wrote_is_escaped_in_the_pages() -> None:
    """Metadata, reasons and ids come from users: the templates escape them (autoescape)."""
    from starlette.requests import Request

    from api.console.batch_pages import actions, why_it_waits
    from api.console.sessions import SessionTable
    from api.console.web import templates
    from backfill.batches.batch import Batch

    evil = '<img src=x onerror="alert(1)">'
    batch = Batch(
        id="batch_x",
        endpoint="/v1/chat/completions",
        input_file_id="file-x",
        completion_window="24h",
        status="in_progress",
        created_at=1,
        metadata={"note": evil},
    )
    batch.backfill.paused, batch.backfill.paused_by = True, evil
    session = SessionTable().create(ALICE, now=0)
    request = Request({"type": "http", "query_string": b"", "headers": [], "path": "/"})
    html = templates.get_template("batch.html").render(
        request=request,
        session=session,
        identity=ALICE,
        batch=batch,
        now=2,
        actions=actions(batch, "member"),
        why=why_it_waits(batch),
    )
    assert evil not in html and "&lt;img src=x" in html
    assert actions(batch, "member") == ["resume", "cancel"] and actions(batch, "auditor") == []


async def test_the_sampler_records_routes_that_answer_and_skips_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from api import errors
    from api.console import sampler as sampler_module
    from api.console.sampler import RouteSampler

    async def route_sample(
        client: object, route: str, configured: int, status: object
    ) -> tuple[int, int, int]:
        assert status == f"status of {route}"
        return 3, configured, 1

    class Poller:
        async def status(self, route: str, max_age: float) -> str:
            if route == "down":
                raise TimeoutError("query timed out")
            return f"status of {route}"

    class Link:
        up = False

        def client(self) -> object:
            if not self.up:
                raise errors.TemporalUnavailable()
            return object()

    monkeypatch.setattr(sampler_module, "route_sample", route_sample)
    samples, link = RouteSamples(), Link()
    sampler = RouteSampler(
        samples,
        link,  # type: ignore[arg-type]
        [("up", 4), ("down", 8)],
        Poller(),  # type: ignore[arg-type]
    )
    await sampler.sample_once()
    assert samples.by_route == {}  # Temporal not connected: no sample, no error
    link.up = True
    await sampler.sample_once()
    [only] = samples.by_route["up"]
    assert (only.running, only.limit, only.live) == (3, 4, 1)
    assert "down" not in samples.by_route


def test_the_batch_page_shows_the_pace_the_expected_finish_and_the_risk() -> None:
    from starlette.requests import Request

    from api.console.batch_pages import actions, why_it_waits
    from api.console.sessions import SessionTable
    from api.console.web import templates
    from backfill.batches.batch import Batch

    batch = Batch(
        id="batch_x",
        endpoint="/v1/chat/completions",
        input_file_id="file-x",
        completion_window="24h",
        status="in_progress",
        created_at=1,
        expires_at=86401,
    )
    session = SessionTable().create(ALICE, now=0)
    request = Request({"type": "http", "query_string": b"", "headers": [], "path": "/"})

    def page() -> str:
        return templates.get_template("batch.html").render(
            request=request,
            session=session,
            identity=ALICE,
            batch=batch,
            now=2,
            actions=actions(batch, "member"),
            why=why_it_waits(batch),
        )

    assert 'id="eta"' not in page()  # no pace known yet: no row
    ext = batch.backfill
    ext.lines_per_second, ext.expected_finish_at, ext.at_risk = 2.5, 90000, True
    html = page()
    assert "2.5 lines/s" in html and "1970-01-02 01:00:00 UTC" in html and "at risk" in html


def route_page(doc: BatchScheduling) -> str:
    """The console's route page for `doc`, as an auditor sees it."""
    from starlette.requests import Request

    from api.console.sessions import SessionTable
    from api.console.web import templates
    from backfill.routes.gates import SETTINGS_GATES
    from backfill.routes.reasons import LEGITIMATE_WAITS

    admin = Identity(workspace="ops", role="auditor", key_name="ops")
    request = Request({"type": "http", "query_string": b"", "headers": [], "path": "/"})
    return templates.get_template("route.html").render(
        request=request,
        session=SessionTable().create(admin, now=0),
        identity=admin,
        doc=doc,
        route=None,
        chart=route_chart([], now=0),
        values=form_values(doc.settings),
        errors={},
        gates=SETTINGS_GATES,
        legitimate=LEGITIMATE_WAITS,
        can_edit=False,
        saved=False,
    )


def test_the_route_page_shows_the_ramp_and_what_preemption_cost() -> None:
    from backfill.routes.reasons import WaitReason

    settings = RouteSettings.model_validate(
        {
            "max_concurrent_lines": 8,
            "seat_aware": {"seats": 10, "keep_free": 2},
            "preempt": {"max_preemptions": 3},
            "reopen_ramp": {"initial": 1, "double_every_s": 2},
        }
    )
    status = SchedulingStatus(
        queued_lines=40,
        running_lines=2,
        limit=2,
        ramping_to=8,
        reason=WaitReason.RAMP,
        preempted_lines=7,
        wasted_tokens=1234,
        reprefill_tokens=567,
        batches=[],
    )
    html = route_page(BatchScheduling(route="r1", settings=settings, status=status))
    assert "2 of 2 at most (ramping up to 8 after a reopen)" in html
    assert "Ramping up after a reopen" in html
    assert "7 line runs, ~1234 tokens wasted, 567 tokens re-prefilled to resume" in html
    assert "from 1 line, doubling every 2 s" in html  # the read-only settings
    # A route without preemption, which never had a line preempted, shows no such row.
    plain = status.model_copy(update={"ramping_to": None, "preempted_lines": 0})
    html = route_page(BatchScheduling(route="r1", settings=RouteSettings(), status=plain))
    assert "ramping up" not in html and "Preempted for live traffic" not in html
    assert "off (all at once)" in html


def test_the_route_page_shows_the_reading_the_scheduler_judged() -> None:
    from backfill.routes.gates.server_load import LoadReading

    on = RouteSettings.model_validate(
        {"server_load": {"metrics_url": "http://127.0.0.1:9/metrics", "max_waiting": 4}}
    )
    judged = LoadReading(waiting=9, running=2, read_at=1_765_000_000)
    status = SchedulingStatus(
        queued_lines=0, running_lines=0, limit=2, batches=[], server_load=judged
    )

    def row(settings: RouteSettings, status: SchedulingStatus) -> str:
        html = route_page(BatchScheduling(route="r1", settings=settings, status=status))
        found = re.search(r"<dt>Server load</dt><dd>(.*?)</dd>", html, re.S)
        assert found is not None
        return re.sub(r"<[^>]+>", " ", found.group(1))

    shown = row(on, status)
    assert "waiting : 9.0" in shown and "read_at : 1765000000" in shown
    assert row(on, status.model_copy(update={"server_load": None})).strip() == "no reading yet"
    unset = status.model_copy(update={"server_load": None})
    assert row(RouteSettings(), unset).strip() == "signal off"


def channel_row(html: str) -> tuple[str, bool] | None:
    """The route page's "Preemption channel" row as an operator reads it (tags dropped), and
    whether it is shown as a warning; None: no such row."""
    found = re.search(r'data-testid="preempt-channel">(.*?)</dd>', html, re.S)
    if found is None:
        return None
    text = re.sub(r"<[^>]+>", "", found.group(1))
    return " ".join(text.split()), 'class="warning"' in found.group(1)


@pytest.mark.parametrize(
    ("preempt", "channel", "row"),
    [
        (
            True,
            None,
            (
                "off (no BACKFILL_PREEMPT_TOKEN): preemption is set but no line is ever preempted",
                True,
            ),
        ),
        (
            True,
            PreemptChannelStatus(workers_found=2, workers_reached=0),
            ("preemption is set but no worker is reachable (2 found)", True),
        ),
        (
            True,
            PreemptChannelStatus(workers_found=3, workers_reached=2),
            ("on: 2 of 3 workers reached", False),
        ),
        (
            False,
            PreemptChannelStatus(workers_found=1, workers_reached=1),
            ("ready (preemption not set): 1 of 1 workers reached", False),
        ),
        (False, None, None),
    ],
    ids=["set-no-token", "set-none-reached", "on", "ready", "neither"],
)
def test_the_route_page_says_whether_preemption_can_act(
    preempt: bool, channel: PreemptChannelStatus | None, row: tuple[str, bool] | None
) -> None:
    """Issue 34, item 5: an operator reads on the route page whether preemption is on and how
    many workers the channel reaches; set but unable to act is a warning."""
    doc: dict[str, object] = {"seat_aware": {"seats": 4}}
    if preempt:
        doc["preempt"] = {"max_preemptions": 3}
    status = SchedulingStatus(
        queued_lines=0, running_lines=0, limit=4, preempt_channel=channel, batches=[]
    )
    html = route_page(
        BatchScheduling(route="r1", settings=RouteSettings.model_validate(doc), status=status)
    )
    assert channel_row(html) == row


def test_a_list_s_paging_links_keep_its_filters_in_order() -> None:
    from api.console.web import templates

    paging = templates.env.get_template("macros.html").module.paging  # type: ignore[attr-defined]
    filters = {"state": "paused", "model": "m/1 x", "workspace": "", "limit": 20}
    html = str(paging("/console/jobs", filters, False, True, "batch_9"))
    query = "state=paused&amp;model=m/1%20x&amp;workspace=&amp;limit=20"
    assert f'<a href="/console/jobs?{query}">First page</a>' in html
    assert f'<a href="/console/jobs?{query}&amp;after=batch_9">Next page</a>' in html
    first = str(paging("/console/batches", {"status": "", "limit": 5}, True, False, None))
    assert "First page" not in first and "Next page" not in first
    assert "refreshes itself every 2 seconds" in first
