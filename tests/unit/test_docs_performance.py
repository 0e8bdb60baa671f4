"""docs/performance.md is a reference for the current code, not a lab notebook: every table of
figures has the command that reproduces it in its section or the one above it, says whether its
figures are medians (or exact, or a single run), and its top-level section says what bounds it
under "What bounds each figure"; the machine is described once for the page. No dated runs, no
account of how loaded the machine was or which run was slowest, no superseded figures: history
lives in git and the decision records (0022, 0026, 0050)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[2] / "docs" / "performance.md"
COMMAND = re.compile(r"(\.venv/bin/python|python -m bench\.|bench/[a-z_]+\.py)")
WHAT = re.compile(r"median|exact|one run|single run", re.I)
"""How a table's figures were reduced: the median of runs, exact (a model), or one run."""
NOTEBOOK = re.compile(
    r"20\d\d-\d\d-\d\d|\d\d:\d\d(–\d\d:\d\d)? UTC|\brepetitions?\b|load average|machine'?s load"
    r"|\bload \d|loaded (by|machine)|(most|a) loaded|\bquiet machine|nothing else running"
    r"|other (engineers|helpers)|alone on the machine|under other test runs"
    r"|earlier run|previous measurement|before the (api|latest)|the latest code|when the file's"
    r"|measured before|the tables above were",
    re.I,
)
"""What a lab notebook says and a reference does not: dates and times of runs, the machine's
load while they ran, which repetition was slowest, figures superseded by later code."""


def prose() -> str:
    """The page without its code blocks (commands may name a trace's `--load`)."""
    return re.sub(r"```.*?```", "", PAGE.read_text(), flags=re.S)


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
def test_every_table_has_its_command_and_says_what_its_figures_are(
    path: list[str], body: str
) -> None:
    parents = [b for p, b in sections() if p and p == path[: len(p)]]
    assert any(COMMAND.search(b) for b in parents), f"{path}: no command that reproduces it"
    assert any(WHAT.search(b) for b in parents), f"{path}: medians, exact or one run?"


def test_every_measured_question_says_what_bounds_it() -> None:
    listed = next(b for p, b in sections() if p == ["Performance", "What bounds each figure"])
    for path, _ in with_tables():
        question = path[1]
        assert f"- **{question}**" in listed, f"{question}: not under What bounds each figure"


def test_no_notebook_on_the_page() -> None:
    """Dated runs, machine load and superseded figures belong in git and docs/decisions/."""
    found = [m.group(0) for m in NOTEBOOK.finditer(prose())]
    assert not found, found
