"""A name is imported from the module that defines it: `backfill.platform.messages` holds the
workflows' and activities' own inputs and outputs, and hands on nothing it imports (a gate's
payloads live in its gate module, `RouteSettings` in `backfill.routes.settings`, the status in
`backfill.routes.status`)."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import backfill.platform.messages

ROOT = Path(__file__).parents[2]


def _imports_through_messages() -> list[str]:
    """Every `from backfill.platform.messages import X` in the repository where `X` is not defined
    in `backfill.platform.messages`, as `path:line: X`."""
    files = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    defined_elsewhere = {
        name
        for node in ast.parse(Path(backfill.platform.messages.__file__).read_text()).body
        if isinstance(node, ast.ImportFrom)
        for name in (a.asname or a.name for a in node.names)
    }
    found = []
    for f in files:
        for node in ast.walk(ast.parse((ROOT / f).read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "backfill.platform.messages":
                found += [
                    f"{f}:{node.lineno}: {a.name}"
                    for a in node.names
                    if a.name in defined_elsewhere
                ]
    return found


def test_nothing_is_imported_through_messages() -> None:
    assert _imports_through_messages() == []


def test_messages_marks_nothing_as_a_re_export() -> None:
    """`import X as X` is the explicit re-export form mypy and ruff honour: none left."""
    tree = ast.parse(Path(backfill.platform.messages.__file__).read_text())
    reexports = [
        a.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom)
        for a in node.names
        if a.asname == a.name
    ]
    assert reexports == []
