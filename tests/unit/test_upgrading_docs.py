"""The version, the changelog and the upgrade page hold together (issue 39): the version in
pyproject.toml has its CHANGELOG entry and its section in docs/upgrading.md; the upgrade page
names every search attribute and every workflow patch in use, so retiring a patch or adding an
attribute fails here until the page says what an operator must do."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from backfill.batches.search_attributes import ALL

ROOT = Path(__file__).resolve().parents[2]


def version() -> str:
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


def test_the_version_is_past_the_untagged_one() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+", version())
    assert version() != "0.1.0"


def test_the_version_is_the_changelogs_newest_entry() -> None:
    entries = re.findall(r"^## (\d+\.\d+\.\d+)\b", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert entries and entries[0] == version()


def test_the_upgrade_page_has_the_version() -> None:
    sections = re.findall(
        r"^## To (\d+\.\d+\.\d+)\b", (ROOT / "docs/upgrading.md").read_text(), re.M
    )
    assert sections and sections[0] == version()


def test_the_upgrade_page_names_every_search_attribute_and_patch() -> None:
    page = (ROOT / "docs/upgrading.md").read_text()
    for name in ALL:
        assert f"`{name}`" in page, name
    patches = re.findall(
        r'^[A-Z_]+ = "([a-z0-9-]+)"', (ROOT / "workflows/patches.py").read_text(), re.M
    )
    assert patches
    for patch in patches:
        assert f"`{patch}`" in page, f"docs/upgrading.md does not name the patch {patch}"
