"""Finalizing waits out the S3 endpoint down for a minute (tests/e2e/outage.py): every
process reaches moto's server through a TCP gate (tests/tcp_gate.py) that the test closes, so
connections are refused as by a server that is down, while moto keeps the bucket's objects."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.e2e.outage import finalize_through, outage_stack
from tests.e2e.stack import moto_server
from tests.tcp_gate import TcpGate


async def test_finalizing_waits_out_the_s3_endpoint_down(tmp_path: Path, dev_server: Any) -> None:
    gate = await TcpGate(moto_server().port).open()
    stack = outage_stack(tmp_path, dev_server.address)
    stack.s3_url = gate.url  # every process reaches moto's server through the gate
    try:
        async with stack.running(workers=0):
            await finalize_through(stack, gate.close, gate.open)
    finally:
        await gate.close()
