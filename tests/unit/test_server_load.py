"""The server-load signal: parsing real `/metrics` captures (vLLM versions, SGLang), the gate's
decision, the approved-URL rule, and the reader against real HTTP servers on loopback (failing
closed, pinned addresses, the reuse cache) and against the simulator."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from pydantic import ValidationError

from backfill.routes.gates.server_load import LoadReading, ServerLoadSettings, judge
from backfill.upstream.load_metrics import (
    approve_metrics_url,
    approved_bases,
    metrics_url_for,
    parse_load,
    parse_local_upstreams,
)
from backfill.upstream.load_reader import (
    RERESOLVE_SECONDS,
    REUSE_SECONDS,
    ServerLoadReader,
    allowed_address,
)
from tools.sim import SimConfig, SimServer

CAPTURES = Path(__file__).parent.parent / "fixtures" / "server-metrics"
T = 1_760_000_000


def capture(name: str) -> str:
    text = (CAPTURES / name).read_text()
    assert text.startswith("# source: ")  # the provenance line is kept (a comment to parsers)
    return text


def values(r: LoadReading) -> tuple[float | None, float | None, float | None]:
    return (r.waiting, r.running, r.kv_cache_percent)


# --- parsing captures -----------------------------------------------------------------------


def test_vllm_one_engine_with_both_kv_gauges() -> None:
    r = parse_load(capture("metrics-1.txt"), T)  # nvcr vllm 25.09, engine="0"
    assert r.error is None and r.read_at == T
    assert (r.waiting, r.running) == (0.0, 0.0)
    assert r.kv_cache_percent == pytest.approx(0.11764705882353343)


def test_vllm_v0_engine_old_kv_gauge_only() -> None:
    r = parse_load(capture("metrics-2.txt"), T)  # gpu_cache_usage_perc, no engine label
    assert r.error is None and values(r) == (0.0, 0.0, 0.0)


def test_vllm_two_data_parallel_engines() -> None:
    r = parse_load(capture("metrics-3.txt"), T)  # only running was pasted, two engines
    assert r.error is None and values(r) == (None, 0.0, None)
    busy = (
        capture("metrics-3.txt")
        .replace(
            'vllm:num_requests_running{engine="0",model_name="deepseek-v4-flash-w8a8-mtp"} 0.0',
            'vllm:num_requests_running{engine="0",model_name="deepseek-v4-flash-w8a8-mtp"} 3.0',
        )
        .replace(
            'vllm:num_requests_running{engine="1",model_name="deepseek-v4-flash-w8a8-mtp"} 0.0',
            'vllm:num_requests_running{engine="1",model_name="deepseek-v4-flash-w8a8-mtp"} 4.0',
        )
    )
    assert parse_load(busy, T).running == 7.0  # summed over engines


def test_vllm_multi_process_pid_copies_take_the_real_value() -> None:
    r = parse_load(capture("metrics-4.txt"), T)  # 8 API processes, one pid carries the value
    assert r.error is None
    assert r.kv_cache_percent == pytest.approx(65.30455880475035)
    assert (r.waiting, r.running) == (None, None)


def test_pid_copies_of_one_engine_count_once_but_engines_add_up() -> None:
    text = "\n".join(
        [
            "# TYPE vllm:num_requests_waiting gauge",
            'vllm:num_requests_waiting{engine="0",model_name="m",pid="11"} 0.0',
            'vllm:num_requests_waiting{engine="0",model_name="m",pid="12"} 5.0',
            'vllm:num_requests_waiting{engine="1",model_name="m",pid="11"} 2.0',
            'vllm:num_requests_waiting{engine="1",model_name="m",pid="12"} 2.0',
            "# TYPE vllm:kv_cache_usage_perc gauge",
            'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25',
            'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75',
            "# TYPE vllm:gpu_cache_usage_perc gauge",
            'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.99',
            "",
        ]
    )
    r = parse_load(text, T)
    assert r.waiting == 7.0  # max per engine over pids (5 + 2), not 9
    assert r.kv_cache_percent == 75.0  # the fullest engine, and the new gauge wins


def test_early_vllm_capture() -> None:
    r = parse_load(capture("metrics-5.txt"), T)  # aioprometheus era, cut off after a HELP line
    assert r.error is None
    assert values(r) == (None, None, pytest.approx(38.849487785658))


def test_official_docs_sample_as_published_is_malformed() -> None:
    text = capture("metrics-6.txt")  # starts with "$ curl ..." and has "..." elisions
    r = parse_load(text, T)
    assert r.error is not None and r.error.startswith("malformed metrics text")
    assert values(r) == (None, None, None)
    cleaned = "\n".join(
        line for line in text.splitlines() if not line.startswith("$") and line != "..."
    )
    r = parse_load(cleaned + "\n", T)
    assert r.error is None and values(r) == (None, 8.0, None)


def test_sglang_gauges() -> None:
    r = parse_load(capture("sglang-metrics-1.txt"), T)
    assert r.error is None and values(r) == (2826.0, 162.0, 28.000000000000004)


@pytest.mark.parametrize(
    "text",
    ["<html><body>Not here</body></html>", "vllm:num_requests_waiting{engine= 1\n", "x y z\n"],
)
def test_malformed_text_is_an_error(text: str) -> None:
    r = parse_load(text, T)
    assert r.error is not None and "malformed" in r.error


def test_non_finite_or_negative_gauges_count_as_missing() -> None:
    r = parse_load("vllm:num_requests_waiting NaN\nvllm:num_requests_running -1\n", T)
    assert r.error is None and values(r) == (None, None, None)


# --- the gate -------------------------------------------------------------------------------


def settings(**limits: Any) -> ServerLoadSettings:
    return ServerLoadSettings(metrics_url="http://10.0.0.5:8000/metrics", **limits)


def reading(**kw: Any) -> LoadReading:
    return LoadReading(read_at=T, **kw)


def test_gate_open_at_or_under_every_limit() -> None:
    s = settings(max_waiting=0, max_running=10, max_kv_cache_percent=90)
    verdict = judge(s, reading(waiting=0, running=10, kv_cache_percent=90))
    assert (verdict.state, verdict.detail) == ("open", None)


def test_gate_busy_over_any_limit() -> None:
    s = settings(max_waiting=0, max_kv_cache_percent=90)
    verdict = judge(s, reading(waiting=1, running=999, kv_cache_percent=91.5))
    assert verdict.state == "busy" and verdict.reading is not None
    assert verdict.detail == "waiting requests 1 > 0; KV cache use 91.5% > 90%"
    assert judge(settings(max_running=4), reading(running=5)).state == "busy"


def test_gate_fails_closed() -> None:
    s = settings(max_waiting=2)
    none_yet = judge(s, None)
    assert (none_yet.state, none_yet.detail) == ("unavailable", "no reading yet")
    failed = judge(s, reading(error="GET http://x/metrics: HTTP 404"))
    assert (failed.state, failed.detail) == ("unavailable", "GET http://x/metrics: HTTP 404")
    # A missing gauge closes the gate only if it has a limit.
    missing = judge(s, reading(running=0, kv_cache_percent=10))
    assert missing.state == "unavailable"
    assert missing.detail == "the server reports no waiting requests gauge"
    assert judge(settings(max_running=2), reading(running=0)).state == "open"


def test_settings_validation() -> None:
    doc = {"metrics_url": "http://10.0.0.5:8000/metrics", "max_waiting": 0, "max_running": None}
    s = ServerLoadSettings.model_validate({**doc, "max_kv_cache_percent": 90})
    assert s.model_dump() == {**doc, "max_kv_cache_percent": 90}
    bad = [
        ({"max_waiting": None}, "at least one limit"),
        ({"max_waiting": -1}, "greater than or equal to 0"),
        ({"max_running": 100_001}, "less than or equal to 100000"),
        ({"max_kv_cache_percent": 0}, "greater than or equal to 1"),
        ({"max_kv_cache_percent": 101}, "less than or equal to 100"),
        ({"metrics_url": "ftp://h/metrics"}, "http:// or https://"),
        ({"metrics_url": "http://u:p@h:8000/metrics"}, "credentials"),
        ({"metrics_url": "http://h:8000/metrics?x=1"}, "query"),
        ({"metrics_url": "http://h:8000/v1"}, "must end with /metrics"),
        ({"metrics_url": "http://h:99999/metrics"}, "not a valid URL"),
        ({"extra": 1}, "Extra inputs"),
    ]
    for change, text in bad:
        with pytest.raises(ValidationError, match=text):
            ServerLoadSettings.model_validate({**doc, **change})


# --- approved URLs ----------------------------------------------------------------------------


def test_metrics_url_is_the_approved_base_without_v1() -> None:
    bases = approved_bases(
        " http://10.0.0.5:8000/v1 , https://gpu.internal/prefix/v1/", ["http://127.0.0.1:8100/v1"]
    )
    assert bases == [
        "http://10.0.0.5:8000/v1",
        "https://gpu.internal/prefix/v1/",
        "http://127.0.0.1:8100/v1",
    ]
    for url in (
        "http://10.0.0.5:8000/metrics",
        "HTTP://10.0.0.5:8000/metrics",
        "https://gpu.internal/prefix/metrics",
        "https://GPU.internal:443/prefix/metrics",
        "http://127.0.0.1:8100/metrics",
    ):
        assert approve_metrics_url(url, bases) == url
    for url in (
        "http://10.0.0.5:8001/metrics",  # another port
        "http://10.0.0.6:8000/metrics",  # another host
        "http://10.0.0.5:8000/v1/metrics",  # the /v1 kept
        "http://10.0.0.5:8000/metrics/",
        "https://10.0.0.5:8000/metrics",  # another scheme
        "http://10.0.0.5:8000/metrics?x",
        "http://user@10.0.0.5:8000/metrics",
        "http://169.254.169.254/latest/meta-data",
    ):
        with pytest.raises(ValueError, match="is not allowed") as e:
            approve_metrics_url(url, bases)
        assert "http://10.0.0.5:8000/metrics" in str(e.value)  # says what is allowed
    with pytest.raises(ValueError, match="no upstream is approved"):
        approve_metrics_url("http://10.0.0.5:8000/metrics", [])


def test_local_upstreams_must_end_in_v1() -> None:
    assert parse_local_upstreams(None) == [] and parse_local_upstreams(" , ") == []
    with pytest.raises(ValueError, match="does not end with /v1"):
        parse_local_upstreams("http://10.0.0.5:8000/v1,http://10.0.0.6:8000")
    with pytest.raises(ValueError, match="not an http"):
        parse_local_upstreams("ftp://10.0.0.5/v1")
    assert metrics_url_for("http://h:1/v1/") == "http://h:1/metrics"
    # A configured route without /v1 simply approves nothing.
    with pytest.raises(ValueError, match="is not allowed"):
        approve_metrics_url("http://h:1/metrics", ["http://h:1"])


# --- the reader against real loopback servers ---------------------------------------------

METRICS = (
    b"# TYPE vllm:num_requests_waiting gauge\n"
    b'vllm:num_requests_waiting{engine="0",model_name="m"} 3.0\n'
    b"# TYPE vllm:num_requests_running gauge\n"
    b'vllm:num_requests_running{engine="0",model_name="m"} 5.0\n'
    b"# TYPE vllm:kv_cache_usage_perc gauge\n"
    b'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5\n'
)


class Upstream:
    """A raw HTTP/1.1 server on loopback whose `/metrics` answer the test chooses."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host, self.port = host, port
        self.mode = "ok"
        self.body = METRICS
        self.requests: list[str] = []
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[Any]] = set()

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    async def start(self) -> Upstream:
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            self.requests.append(head.decode("latin-1"))
            await self._answer(writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._handlers.discard(task)
            writer.close()

    async def _answer(self, w: asyncio.StreamWriter) -> None:
        ok = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
        if self.mode == "ok":
            w.write(ok + b"Content-Length: %d\r\n\r\n" % len(self.body) + self.body)
        elif self.mode == "404":
            w.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\n\r\nnot found")
        elif self.mode == "redirect":
            w.write(b"HTTP/1.1 302 Found\r\nLocation: /v1/models\r\nContent-Length: 0\r\n\r\n")
        elif self.mode in ("big", "big-declared"):  # 2 MiB
            size = 2 * 1024 * 1024
            declared = b"Content-Length: %d\r\n" % size if self.mode == "big-declared" else b""
            w.write(ok + declared + b"Connection: close\r\n\r\n")
            line = b"# " + b"x" * 1021 + b"\n"
            for _ in range(size // len(line)):
                w.write(line)
                await w.drain()
        elif self.mode == "slow":  # headers at once, half the body, the rest after 3 s
            w.write(ok + b"Content-Length: %d\r\n\r\n" % len(self.body) + self.body[:40])
            await w.drain()
            await asyncio.sleep(3)
            w.write(self.body[40:])
        await w.drain()


@pytest_asyncio.fixture(loop_scope="session")
async def upstream() -> AsyncIterator[Upstream]:
    server = await Upstream().start()
    yield server
    await server.stop()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def reader_for(*bases: str, **kw: Any) -> ServerLoadReader:
    return ServerLoadReader(bases, wall_clock=lambda: float(T), **kw)


async def test_reads_a_live_server(upstream: Upstream) -> None:
    r = await reader_for(upstream.base_url).read(upstream.metrics_url)
    assert r == LoadReading(waiting=3.0, running=5.0, kv_cache_percent=50.0, read_at=T)
    (request,) = upstream.requests
    assert request.startswith("GET /metrics HTTP/1.1\r\n")
    assert f"host: 127.0.0.1:{upstream.port}" in request.lower()
    assert "authorization" not in request.lower() and "cookie" not in request.lower()


@pytest.mark.parametrize(
    ("mode", "body", "expected"),
    [
        ("404", METRICS, "HTTP 404"),
        ("redirect", METRICS, "redirects are not followed (HTTP 302)"),
        ("big", METRICS, "body larger than 1048576 bytes"),
        ("big-declared", METRICS, "body larger than 1048576 bytes"),
        ("ok", b"<html><body>metrics moved</body></html>", "malformed metrics text"),
        ("ok", b"\xff\xfe\x00", "not UTF-8"),
    ],
)
async def test_fails_closed(upstream: Upstream, mode: str, body: bytes, expected: str) -> None:
    upstream.mode, upstream.body = mode, body
    r = await reader_for(upstream.base_url).read(upstream.metrics_url)
    assert r.error is not None and expected in r.error
    assert r.error.startswith(f"GET {upstream.metrics_url}: ")
    assert values(r) == (None, None, None)
    assert len(upstream.requests) == 1  # no retry, no redirect followed
    gate = judge(ServerLoadSettings(metrics_url=upstream.metrics_url, max_running=100), r)
    assert gate.state == "unavailable" and gate.detail == r.error


async def test_a_slow_body_fails_within_the_deadline(upstream: Upstream) -> None:
    upstream.mode = "slow"
    started = time.monotonic()
    r = await reader_for(upstream.base_url).read(upstream.metrics_url)
    elapsed = time.monotonic() - started
    assert r.error is not None and "no complete answer within 2 s" in r.error
    assert 1.9 <= elapsed < 2.9  # the 2 s deadline bounds the whole fetch


async def test_a_missing_gauge_with_a_limit_closes_the_gate(upstream: Upstream) -> None:
    upstream.body = METRICS.split(b"# TYPE vllm:num_requests_running")[0]  # waiting only
    r = await reader_for(upstream.base_url).read(upstream.metrics_url)
    assert r.error is None and values(r) == (3.0, None, None)
    s = ServerLoadSettings(metrics_url=upstream.metrics_url, max_waiting=10, max_running=10)
    verdict = judge(s, r)
    assert (verdict.state, verdict.detail) == (
        "unavailable",
        "the server reports no running requests gauge",
    )


async def test_connection_refused() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    r = await reader_for(f"http://127.0.0.1:{port}/v1").read(f"http://127.0.0.1:{port}/metrics")
    assert r.error is not None and "cannot connect" in r.error


async def test_a_url_outside_the_approved_list_is_never_fetched(upstream: Upstream) -> None:
    calls: list[str] = []

    async def resolve(host: str, port: int) -> list[str]:
        calls.append(host)
        return ["127.0.0.1"]

    reader = reader_for("http://10.0.0.5:8000/v1", resolve=resolve)
    for url in (upstream.metrics_url, f"http://localhost:{upstream.port}/metrics"):
        r = await reader.read(url)
        assert r.error is not None and "is not allowed" in r.error
    assert upstream.requests == [] and calls == []


async def test_pinned_addresses_are_resolved_once_and_never_elsewhere(
    upstream: Upstream,
) -> None:
    try:
        other = await Upstream("127.0.0.2", upstream.port).start()  # same port, other address
    except OSError as e:
        pytest.skip(f"cannot bind 127.0.0.2 here: {e}")
    try:
        answer = ["127.0.0.1"]
        calls: list[tuple[str, int]] = []

        async def resolve(host: str, port: int) -> list[str]:
            calls.append((host, port))
            return list(answer)

        clock = Clock()
        base = f"http://fake.test:{upstream.port}/v1"
        url = f"http://fake.test:{upstream.port}/metrics"
        reader = reader_for(base, resolve=resolve, clock=clock)
        assert reader.pinned("fake.test", upstream.port) is None
        first = await reader.read(url)
        assert first.error is None and first.running == 5.0
        assert f"host: fake.test:{upstream.port}" in upstream.requests[0].lower()
        assert reader.pinned("fake.test", upstream.port) == ["127.0.0.1"]

        answer[:] = ["127.0.0.2"]  # the name now points elsewhere
        other.body = METRICS.replace(b"5.0", b"99.0")
        for _ in range(3):
            clock.now += 10  # past the reuse window: fetch again
            again = await reader.read(url)
            assert again.error is None and again.running == 5.0
        assert calls == [("fake.test", upstream.port)]
        assert len(upstream.requests) == 4 and other.requests == []
    finally:
        await other.stop()


async def test_readings_are_reused_for_five_seconds(upstream: Upstream) -> None:
    clock = Clock()
    reader = reader_for(upstream.base_url, clock=clock)
    results = await asyncio.gather(*(reader.read(upstream.metrics_url) for _ in range(5)))
    assert len(upstream.requests) == 1 and len(set(results)) == 1
    clock.now += 4.9
    await reader.read(upstream.metrics_url)
    assert len(upstream.requests) == 1
    clock.now += 0.1
    upstream.mode = "404"
    failed = await reader.read(upstream.metrics_url)
    assert len(upstream.requests) == 2 and failed.error is not None
    await reader.read(upstream.metrics_url)  # a failure is reused too: no hammering
    assert len(upstream.requests) == 2


async def test_proxy_variables_are_ignored(
    upstream: Upstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")  # nothing listens on the discard port
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    r = await reader_for(upstream.base_url).read(upstream.metrics_url)
    assert r.error is None and len(upstream.requests) == 1


async def test_reads_the_simulator() -> None:
    async with SimServer(SimConfig(max_num_seqs=4, latency_ms=0)) as sim:
        url = sim.url + "/metrics"
        reader = reader_for(sim.base_url, reuse_seconds=0)
        idle = await reader.read(url)
        assert idle.error is None and values(idle) == (0.0, 0.0, 0.0)
        for _ in range(4):
            await sim.app.scheduler.acquire()  # four endless requests fill the engine
        full = await reader.read(url)
        assert full.error is None and values(full) == (0.0, 4.0, 100.0)
        s = ServerLoadSettings(metrics_url=url, max_running=3)
        assert judge(s, full).state == "busy"
        for _ in range(4):
            sim.app.scheduler.release()
        assert values(await reader.read(url)) == (0.0, 0.0, 0.0)


def test_a_reading_is_exported_per_signal_and_a_failed_one_as_an_error() -> None:
    from prometheus_client import REGISTRY

    from backfill.upstream.load_reader import export_reading

    def sample(name: str, **labels: str) -> float | None:
        return REGISTRY.get_sample_value(name, labels)

    errors = sample("gateway_server_load_errors_total", provider="rl1") or 0.0
    export_reading("rl1", LoadReading(waiting=3, running=7, kv_cache_percent=41.5, read_at=1))
    assert sample("gateway_server_load", provider="rl1", signal="waiting") == 3
    assert sample("gateway_server_load", provider="rl1", signal="running") == 7
    assert sample("gateway_server_load", provider="rl1", signal="kv_cache_percent") == 41.5
    export_reading("rl1", LoadReading(read_at=2, error="GET http://x/metrics: refused"))
    assert sample("gateway_server_load_errors_total", provider="rl1") == errors + 1
    assert sample("gateway_server_load", provider="rl1", signal="waiting") == 3  # last reading


async def test_a_failed_fetch_resolves_the_name_again(upstream: Upstream) -> None:
    """The model server moved (a rescheduled pod behind DNS): after one failed fetch the next
    resolves again, instead of keeping the gate closed until a restart."""
    answers = [["127.0.0.3"], ["127.0.0.1"]]  # nothing listens on 127.0.0.3 at that port
    calls: list[str] = []

    async def resolve(host: str, port: int) -> list[str]:
        calls.append(host)
        return answers[min(len(calls), len(answers)) - 1]

    clock = Clock()
    url = f"http://moved.test:{upstream.port}/metrics"
    reader = reader_for(f"http://moved.test:{upstream.port}/v1", resolve=resolve, clock=clock)
    first = await reader.read(url)
    assert first.error is not None and "cannot connect" in first.error
    clock.now += REUSE_SECONDS  # the failed reading is reused until then
    again = await reader.read(url)
    assert again.error is None and again.running == 5.0
    assert calls == ["moved.test", "moved.test"]
    assert reader.pinned("moved.test", upstream.port) == ["127.0.0.1"]


async def test_names_are_resolved_again_periodically(upstream: Upstream) -> None:
    try:
        other = await Upstream("127.0.0.2", upstream.port).start()
    except OSError as e:
        pytest.skip(f"cannot bind 127.0.0.2 here: {e}")
    try:
        answer = ["127.0.0.1"]

        async def resolve(host: str, port: int) -> list[str]:
            return list(answer)

        clock = Clock()
        url = f"http://fake.test:{upstream.port}/metrics"
        reader = reader_for(f"http://fake.test:{upstream.port}/v1", resolve=resolve, clock=clock)
        assert (await reader.read(url)).running == 5.0
        answer[:] = ["127.0.0.2"]
        other.body = METRICS.replace(b"5.0", b"99.0")
        clock.now += RERESOLVE_SECONDS - 1  # a fetch, but still the pinned address
        assert (await reader.read(url)).running == 5.0
        clock.now += REUSE_SECONDS  # past the re-resolve period (and the last reading's reuse)
        assert (await reader.read(url)).running == 99.0
        assert reader.pinned("fake.test", upstream.port) == ["127.0.0.2"]
        assert len(upstream.requests) == 2 and len(other.requests) == 1
    finally:
        await other.stop()


async def test_every_resolved_address_is_checked(upstream: Upstream) -> None:
    answer = ["169.254.169.254"]  # a cloud metadata endpoint

    async def resolve(host: str, port: int) -> list[str]:
        return list(answer)

    clock = Clock()
    url = f"http://fake.test:{upstream.port}/metrics"
    reader = reader_for(f"http://fake.test:{upstream.port}/v1", resolve=resolve, clock=clock)
    r = await reader.read(url)
    assert r.error is not None and "resolves only to addresses not allowed" in r.error
    assert reader.pinned("fake.test", upstream.port) is None
    answer[:] = ["fe80::1", "0.0.0.0", "127.0.0.1"]
    clock.now += RERESOLVE_SECONDS
    assert (await reader.read(url)).running == 5.0
    assert reader.pinned("fake.test", upstream.port) == ["127.0.0.1"]
    assert [allowed_address(a) for a in ("10.0.0.5", "::1", "224.0.0.1", "240.0.0.1")] == [
        True,
        True,
        False,
        False,
    ]
