"""worker.memory: the worker caps glibc's malloc arenas unless the environment already does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from worker.memory import limit_malloc_arenas


def test_the_environment_s_setting_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert limit_malloc_arenas() is False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_applied_in_a_fresh_process_on_linux() -> None:
    """In a child, so this test process's allocator is left alone."""
    code = "from worker.memory import limit_malloc_arenas; print(limit_malloc_arenas())"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert out.stdout.strip() == "True"
