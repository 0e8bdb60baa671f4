"""Numbers the docs state in prose, held to what the code and the shipped config keep (issue 39:
an audit found several that had drifted). Each test reads the number from the page and the
truth from the code."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def doc(name: str) -> str:
    return (ROOT / name).read_text()


def the_dev_route() -> dict[str, object]:
    config = tomllib.loads(doc("backfill.toml"))
    return config["models"][0]["routes"][0]  # type: ignore[no-any-return]


def test_the_simulators_route_lines_at_once() -> None:
    stated = re.findall(r"simulator's route runs (\d+) lines at once", doc("docs/cli.md"))
    assert stated, "docs/cli.md no longer states it: drop this test"
    assert {int(n) for n in stated} == {the_dev_route()["max_concurrent_lines"]}
