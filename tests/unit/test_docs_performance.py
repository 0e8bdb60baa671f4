"""docs/performance.md holds current figures only: every table of figures says, in its own
section, the date it was measured, and the command that reproduces it is in that section or the
one above it; the machine is described once for the page. Earlier runs, earlier settings and
what was tried live in the decision records (0022, 0026), not here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[2] / "docs" / "performance.md"
DATE = re.compile(r"20\d\d-\d\d-\d\d")
COMMAND = re.compile(r"(\.venv/bin/python|python -m bench\.|bench/[a-z_]+\.py)")
HISTORY = re.compile(
    r"earlier run|previous measurement|before the (api|latest)|the latest code|when the file's",
    re.I,
)


def sections() -> list[tuple[list[str], str]]:
    """(heading path, body) of every section of the page, body without its subsections."""
    out: list[tuple[list[str], str]] = []
    path: list[str] = []
    body: list[str] = []
    in_fence = False
    for line in PAGE.read_text().splitlines():
        if line.startswith("```"):
            in_fence = not in_fence
        m = None if in_fence else re.match(r"(#+) (.*)", line)
        if m:
            out.append((list(path), "\n".join(body)))
            level = len(m.group(1))
            path = path[: level - 1] + [m.group(2)]
            body = []
        else:
            body.append(line)
    out.append((list(path), "\n".join(body)))
    return out


def with_tables() -> list[tuple[list[str], str]]:
    return [(p, b) for p, b in sections() if re.search(r"^\|", b, re.M)]


def test_the_page_has_figures() -> None:
    assert len(with_tables()) >= 8


def test_the_machine_is_described() -> None:
    text = PAGE.read_text()
    assert "**The machine**" in text and "2-core" in text


@pytest.mark.parametrize(
    "path,body", with_tables(), ids=lambda v: " / ".join(v) if isinstance(v, list) else ""
)
def test_every_table_has_its_date_and_command(path: list[str], body: str) -> None:
    assert DATE.search(body), f"{path}: no measurement date in the section of its table"
    parents = [b for p, b in sections() if p and p == path[: len(p)]]
    assert any(COMMAND.search(b) for b in parents), f"{path}: no command that reproduces it"


def test_no_history_on_the_page() -> None:
    """History (earlier settings, superseded runs) belongs in docs/decisions/."""
    found = [m.group(0) for m in HISTORY.finditer(PAGE.read_text())]
    assert not found, found
