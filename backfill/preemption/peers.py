"""Finding the activity workers for preemptive yield's channel: they register themselves.

Each activity worker that serves the channel polls the task queue with an identity that names
its channel's address (`identity`: `<pid>@<host> preempt=http://10.0.0.5:9464`). Temporal keeps
the pollers of a task queue with the time each last polled, so `find_workers` (a
`DescribeTaskQueue` call: no history) lists every worker polling now, wherever it runs: a
Deployment's pods, compose replicas, `backfill dev`. A worker that joins is found at the next
look (every `LOOK_EVERY` seconds); one that stopped polling drops out after `POLLER_FRESH`
seconds. Nothing has to be listed or resolved (docs/decisions/0034).

Whoever can poll the task queue can name any address in its identity, so an address is used only
when it is an IP address inside the configured networks (`BACKFILL_PREEMPT_NETWORKS`): reports
are signed and carry no secret (`backfill.preemption.signing`), and they still go only where the
workers can be (docs/decisions/0046).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import time
from collections.abc import Sequence
from datetime import timedelta
from urllib.parse import urlsplit

from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client

from backfill.platform.metrics import PREEMPT_ADDRESSES_IGNORED

MARK = "preempt="
LOOK_EVERY = 5.0
"""Seconds between two looks at the task queue's pollers."""
POLLER_FRESH = 90.0
"""Seconds since its last poll after which a worker is taken for gone (an idle worker's long
poll lasts up to about a minute, so a shorter bound would drop live workers)."""
DEFAULT_PREEMPT_NETWORKS = "127.0.0.0/8,::1/128,10.0.0.0/8,172.16.0.0/12,192.168.0.0/16,fc00::/7"
"""Loopback and the private ranges: where pods, compose containers and `backfill dev` live."""

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(text: str) -> list[Network]:
    """`BACKFILL_PREEMPT_NETWORKS` (comma-separated CIDRs); ValueError naming a bad one."""
    networks = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            networks.append(ipaddress.ip_network(part, strict=False))
        except ValueError as err:
            raise ValueError(
                f"BACKFILL_PREEMPT_NETWORKS: {part!r} is not a network: {err}"
            ) from None
    return networks


def allowed(url: str, networks: Sequence[Network]) -> bool:
    """Whether a found channel address is `http://<IP address in networks>:<port>`."""
    try:
        parts = urlsplit(url)
        address = ipaddress.ip_address(parts.hostname or "")
        port = parts.port
    except ValueError:
        return False
    return (
        parts.scheme == "http"
        and port is not None
        and parts.path in ("", "/")
        and not parts.query
        and any(address in n for n in networks)
    )


def identity(channel_url: str | None) -> str:
    """A worker's Temporal identity: the SDK's default (`pid@host`), and its channel's address
    when it serves one."""
    base = f"{os.getpid()}@{socket.gethostname()}"
    return f"{base} {MARK}{channel_url}" if channel_url else base


def channel_url(host: str, port: int) -> str:
    """The address other processes reach this worker's channel at: its metrics host, or, when
    that is every interface, the address its host name resolves to (a name is resolved too:
    the others use IP addresses only)."""
    if host in ("", "0.0.0.0", "::"):
        try:
            host = socket.gethostbyname(socket.gethostname())
        except OSError:
            host = "127.0.0.1"
    else:
        try:
            ipaddress.ip_address(host)
        except ValueError:
            try:
                host = socket.gethostbyname(host)
            except OSError:
                pass  # left as named: the others ignore it (and count it)
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def url_of(poller_identity: str) -> str | None:
    """The channel address a poller's identity names (None: none)."""
    for word in poller_identity.split():
        if word.startswith(MARK) and word[len(MARK) :].startswith("http"):
            return word[len(MARK) :]
    return None


LOOK_TIMEOUT = timedelta(seconds=5)
"""The most one look at the task queue's pollers may take: the api's and the workers' channel
loops look every 5 s, and a Temporal that does not answer must not stall them."""


async def find_workers(
    client: Client,
    task_queue: str,
    networks: Sequence[Network] | None = None,
    now: float | None = None,
) -> list[str]:
    """The channel addresses of the activity workers polling `task_queue` now, those inside
    `networks` only (default: `DEFAULT_PREEMPT_NETWORKS`)."""
    if networks is None:
        networks = parse_networks(DEFAULT_PREEMPT_NETWORKS)
    resp = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=client.namespace,
            task_queue=TaskQueue(name=task_queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
        ),
        timeout=LOOK_TIMEOUT,
    )
    now = time.time() if now is None else now
    urls = {
        url
        for p in resp.pollers
        if (url := url_of(p.identity)) is not None
        and now - p.last_access_time.ToSeconds() < POLLER_FRESH
    }
    kept = {u for u in urls if allowed(u, networks)}
    PREEMPT_ADDRESSES_IGNORED.inc(len(urls - kept))
    return sorted(kept)
