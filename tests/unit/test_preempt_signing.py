"""Preemptive yield's channel without a secret on the wire (issue 47, item 3; decision 0046):
reports are signed and never carry the token, a report that is forged, changed, stale or sent
again is refused, found addresses outside the configured networks are not sent anything, the
other workers' lines a route keeps are capped, a short token is refused at start, and a report
that does not arrive is counted and logged at warning."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from prometheus_client import REGISTRY
from pydantic import ValidationError

from activities.preemption.board import PreemptBoard
from api.live.traffic import LiveTraffic
from api.preemption.push import PreemptSender
from backfill.platform.config import Settings
from backfill.preemption.peers import find_workers, parse_networks
from backfill.preemption.signing import (
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    WINDOW,
    sign,
    verified_at,
)
from tests.unit.test_preempt_push import POLICY, SlowLink
from tests.unit.test_preemption import TOKEN
from worker.preemption.channel import LINES_PATH, PATH, PreemptChannel
from worker.preemption.peers import PeerSender


def live_body(process: str = "api-a", live: int = 2) -> bytes:
    return json.dumps({"route": "r1", "process": process, "live": live}).encode()


def channel() -> tuple[PreemptBoard, PreemptChannel]:
    board = PreemptBoard()
    board.set_policy("r1", POLICY)
    return board, PreemptChannel(board, asyncio.get_running_loop(), TOKEN, ["r1"], worker="me")


def handle(ch: PreemptChannel, headers: Mapping[str, str], body: bytes, path: str = PATH) -> int:
    return ch.handle(headers.get(TIMESTAMP_HEADER), headers.get(SIGNATURE_HEADER), body, path)


async def test_a_report_is_taken_only_with_the_tokens_signature_in_its_window() -> None:
    board, ch = channel()
    now = time.time()
    body = live_body(live=7)
    assert handle(ch, {"Authorization": f"Bearer {TOKEN}"}, body) == 401  # the old way: refused
    assert handle(ch, sign("x" * 32, PATH, body, now), body) == 401  # another key
    assert handle(ch, sign(TOKEN, PATH, body, now), live_body(live=9)) == 401  # a changed body
    assert handle(ch, sign(TOKEN, LINES_PATH, body, now), body) == 401  # signed for another path
    assert handle(ch, sign(TOKEN, PATH, body, now - WINDOW - 1), body) == 401  # too old
    assert handle(ch, sign(TOKEN, PATH, body, now + WINDOW + 1), body) == 401  # from the future
    signed = sign(TOKEN, PATH, body, now)
    assert handle(ch, signed, body) == 204
    assert handle(ch, signed, body) == 409  # the same report again: a replay
    older = sign(TOKEN, PATH, live_body(live=1), now - 1)
    assert handle(ch, older, live_body(live=1)) == 409  # an earlier report of that sender
    other = sign(TOKEN, PATH, live_body("api-b"), now - 1)
    assert handle(ch, other, live_body("api-b")) == 204  # another sender: its own sequence
    await asyncio.sleep(0)
    assert board._routes["r1"].reports["api-a"].live == 7


def test_a_signature_is_checked_whole() -> None:
    body = live_body()
    headers = sign(TOKEN, PATH, body, 1000.0)
    at = verified_at(TOKEN, PATH, body, headers[TIMESTAMP_HEADER], headers[SIGNATURE_HEADER], 1000)
    assert at == 1000.0
    for timestamp, signature in [
        (None, headers[SIGNATURE_HEADER]),
        (headers[TIMESTAMP_HEADER], None),
        ("1000.5", headers[SIGNATURE_HEADER]),  # another time, the same signature
        ("nan", headers[SIGNATURE_HEADER]),
        (headers[TIMESTAMP_HEADER], headers[SIGNATURE_HEADER][:-1]),
        ("1" * 40, headers[SIGNATURE_HEADER]),
    ]:
        assert verified_at(TOKEN, PATH, body, timestamp, signature, 1000) is None


class Wire:
    """What a sender puts on the wire, each request answered by a worker's channel."""

    def __init__(self, ch: PreemptChannel) -> None:
        self.ch = ch
        self.requests: list[httpx.Request] = []
        self.statuses: list[int] = []

    async def take(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        self.statuses.append(handle(self.ch, request.headers, request.content, request.url.path))
        return httpx.Response(self.statuses[-1])

    def assert_no_token(self) -> None:
        assert self.requests
        for request in self.requests:
            raw = b"".join(k + b": " + v for k, v in request.headers.raw) + request.content
            assert TOKEN.encode() not in raw
            assert "authorization" not in request.headers


async def test_the_api_sends_no_token_and_a_signature_the_worker_takes() -> None:
    """Every byte the api's sender puts on the wire, captured: no token, in any header or the
    body; and the worker's channel takes the report as sent."""
    wire = Wire(channel()[1])
    sender = PreemptSender(
        LiveTraffic(["r1"]),
        SlowLink(),  # type: ignore[arg-type]
        ["r1"],
        ["http://worker"],
        TOKEN,
        "api-1",
        transport=httpx.MockTransport(wire.take),
    )
    sender.start()
    try:
        async with asyncio.timeout(5):
            while len(wire.requests) < 2:  # the first report and a keep-alive
                await asyncio.sleep(0.05)
    finally:
        await sender.stop()
    wire.assert_no_token()
    assert set(wire.statuses) == {204}


async def test_a_worker_sends_its_lines_with_no_token() -> None:
    wire = Wire(channel()[1])
    board = PreemptBoard(worker="B")
    sender = PeerSender(
        None,  # type: ignore[arg-type]  # no look at the task queue: the peer is set below
        board,
        worker="B",
        own_url="http://10.0.0.2:9464",
        task_queue="tq",
        token=TOKEN,
        transport=httpx.MockTransport(wire.take),
    )
    sender._http = httpx.AsyncClient(transport=httpx.MockTransport(wire.take))
    sender.peers = ["http://10.0.0.1:9464"]
    try:
        await sender._send("r1")
    finally:
        await sender._http.aclose()
    wire.assert_no_token()
    assert wire.statuses == [204]


def pollers_service(*identities: str) -> Any:
    t = Timestamp()
    t.FromSeconds(1000)
    pollers = [SimpleNamespace(identity=i, last_access_time=t) for i in identities]

    class Service:
        async def describe_task_queue(self, request: Any, timeout: Any = None) -> Any:  # noqa: ASYNC109
            return SimpleNamespace(pollers=pollers)

    return SimpleNamespace(workflow_service=Service(), namespace="default")


async def test_found_addresses_outside_the_networks_are_ignored() -> None:
    client = pollers_service(
        "1@a preempt=http://10.0.0.1:9464",
        "2@b preempt=http://8.8.8.8:9464",  # a public address
        "3@c preempt=http://169.254.169.254:80",  # the cloud's metadata service
        "4@d preempt=http://attacker.example:9464",  # a name: resolved where? not used
        "5@e preempt=http://10.0.0.5:9464/elsewhere",  # a path
        "6@f preempt=http://[fd00::5]:9464",
        "7@g preempt=http://10.0.0.7",  # no port
    )
    ignored = "gateway_preempt_addresses_ignored_total"
    before = REGISTRY.get_sample_value(ignored) or 0.0
    found = await find_workers(client, "tq", now=1000)
    assert found == ["http://10.0.0.1:9464", "http://[fd00::5]:9464"]
    assert (REGISTRY.get_sample_value(ignored) or 0.0) - before == 5
    # The networks are the operator's: only 10.0.0.0/24 here.
    only = parse_networks("10.0.0.0/24")
    assert await find_workers(client, "tq", only, now=1000) == ["http://10.0.0.1:9464"]


def test_networks_are_checked_at_start() -> None:
    with pytest.raises(ValidationError, match="BACKFILL_PREEMPT_NETWORKS: 'ten' is not"):
        Settings(preempt_networks="10.0.0.0/8, ten")
    assert Settings(preempt_networks="100.64.0.0/10").preempt_networks == "100.64.0.0/10"


def test_a_short_token_is_refused_at_start() -> None:
    with pytest.raises(ValidationError, match="BACKFILL_PREEMPT_TOKEN has 11 characters; it must"):
        Settings(preempt_token="e2e-channel")
    assert Settings(preempt_token=TOKEN).preempt_token == TOKEN


def test_the_other_workers_lines_are_capped_per_route() -> None:
    """256 made-up workers x 4,096 lines each would make every preemption rank a million
    lines: a route keeps `max_peers` workers and `max_peer_lines` lines of theirs."""
    board = PreemptBoard(max_peers=3, max_peer_lines=100)
    dropped = "gateway_preempt_peer_reports_dropped_total"

    def count(reason: str) -> float:
        return REGISTRY.get_sample_value(dropped, {"route": "r1", "reason": reason}) or 0.0

    peers_before, lines_before = count("peers"), count("lines")
    for w in range(256):
        board.peer_lines("r1", f"fake-{w}", [(1.0, True)] * 40)
    kept = board._routes["r1"].peers
    assert sorted(kept) == ["fake-0", "fake-1"]  # a third would take 120 lines
    assert sum(len(p.started) for p in kept.values()) <= 100
    assert count("lines") - lines_before == 254 and count("peers") - peers_before == 0
    board.peer_lines("r1", "small", [(1.0, True)] * 5)
    assert count("peers") - peers_before == 0 and len(board._routes["r1"].peers) == 3
    board.peer_lines("r1", "one-more", [(1.0, True)])
    assert count("peers") - peers_before == 1 and "one-more" not in board._routes["r1"].peers
    # A worker already kept may report again, within the cap (its own earlier lines excepted).
    board.peer_lines("r1", "fake-0", [(1.0, True)] * 55)
    assert len(board._routes["r1"].peers["fake-0"].started) == 55


def test_the_caps_are_settings() -> None:
    s = Settings(preempt_max_peers=4, preempt_max_peer_lines=500)
    assert (s.preempt_max_peers, s.preempt_max_peer_lines) == (4, 500)
    defaults = Settings()
    assert defaults.preempt_max_peers * 4096 > defaults.preempt_max_peer_lines  # the lines bind


async def test_an_unreachable_worker_is_counted_and_logged_at_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    failures = "gateway_preempt_send_failures_total"

    def count() -> float:
        labels = {"path": "live", "reason": "unreachable"}
        return REGISTRY.get_sample_value(failures, labels) or 0.0

    async def gone(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    before = count()
    sender = PreemptSender(
        LiveTraffic(["r1"]),
        SlowLink(),  # type: ignore[arg-type]
        ["r1"],
        ["http://gone:9464"],
        TOKEN,
        "api-1",
        transport=httpx.MockTransport(gone),
    )
    with caplog.at_level(logging.WARNING, logger="api.preemption.push"):
        sender.start()
        try:
            async with asyncio.timeout(10):
                while count() - before < 3:  # the first report and two keep-alives
                    await asyncio.sleep(0.05)
        finally:
            await sender.stop()
    warnings = [r for r in caplog.records if "http://gone:9464" in r.getMessage()]
    assert len(warnings) == 1  # once a minute per worker and cause, not once a report
    assert warnings[0].levelno == logging.WARNING and "unreachable" in warnings[0].getMessage()
    assert TOKEN not in caplog.text
