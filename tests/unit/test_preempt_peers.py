"""Finding preemptive yield's workers on the task queue (`backfill.preemption.peers`): a worker's
identity names its channel, and a poller's identity is read back."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from backfill.preemption.peers import POLLER_FRESH, channel_url, find_workers, identity, url_of


def test_an_identity_names_the_channel_and_is_read_back() -> None:
    url = channel_url("10.0.0.5", 9464)
    assert url == "http://10.0.0.5:9464"
    assert url_of(identity(url)) == url
    assert url_of(identity(None)) is None  # a worker without the channel
    assert url_of("123@host") is None and url_of("1@h preempt=ftp://x") is None
    assert channel_url("::1", 9464) == "http://[::1]:9464"
    assert channel_url("0.0.0.0", 9464).startswith("http://")  # the host name's address
    # A name is resolved: the others use IP addresses only (`BACKFILL_PREEMPT_NETWORKS`).
    assert channel_url("localhost", 9464) == "http://127.0.0.1:9464"


async def test_only_workers_polling_now_are_found() -> None:
    def poller(ident: str, seconds_ago: float) -> Any:
        t = Timestamp()
        t.FromSeconds(int(1000 - seconds_ago))
        return SimpleNamespace(identity=ident, last_access_time=t)

    pollers = [
        poller("1@a preempt=http://10.0.0.1:9464", 5),
        poller("2@b preempt=http://10.0.0.2:9464", POLLER_FRESH + 10),  # gone
        poller("3@c", 1),  # no channel
        poller("4@a preempt=http://10.0.0.1:9464", 1),  # the same address twice
    ]

    class Service:
        async def describe_task_queue(self, request: Any, timeout: timedelta) -> Any:  # noqa: ASYNC109
            assert request.task_queue.name == "tq"
            # A Temporal that does not answer must not stall the channel's loops.
            assert timeout <= timedelta(seconds=5)
            return SimpleNamespace(pollers=pollers)

    client: Any = SimpleNamespace(workflow_service=Service(), namespace="default")
    assert await find_workers(client, "tq", now=1000) == ["http://10.0.0.1:9464"]
