"""Finalizing waits out the local store's disk full for 25 s (tests/e2e/outage.py): the
data directory is a 32 MiB tmpfs (root only; skipped otherwise, and on an S3 run), filled with
zeros until ENOSPC, then freed."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.outage import SHORT_OUTAGE_SECONDS, finalize_through, outage_stack


def _mount_tmpfs(path: Path, size: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs (a disk that fills up) needs root")
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")


def _fill(path: Path) -> None:
    """Write zeros to `path` until the disk is full."""
    chunk = b"\0" * (1 << 20)
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                f.write(chunk)
        except OSError as err:
            if err.errno != errno.ENOSPC:
                raise
    # The last pages too: a write smaller than a chunk may still have found room.
    with open(path, "ab", buffering=0) as f:
        with contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 512)


async def test_finalizing_waits_out_a_full_disk(tmp_path: Path, dev_server: Any) -> None:
    stack = outage_stack(tmp_path, dev_server.address)
    if stack.s3_url is not None:
        pytest.skip("the local store's disk (this run's store is S3)")
    data = tmp_path / "data"
    _mount_tmpfs(data, "32m")
    filler = data / "filler"
    try:
        async with stack.running(workers=0):

            async def full() -> None:
                await asyncio.to_thread(_fill, filler)

            async def freed() -> None:
                filler.unlink()

            await finalize_through(stack, full, freed, hold=SHORT_OUTAGE_SECONDS)
    finally:
        await asyncio.to_thread(subprocess.run, ["umount", "-l", str(data)], check=False)
