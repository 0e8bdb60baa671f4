"""Claims the pages make about the code, each read back from the code (issue 48): the answer to a
missing search attribute, the tags a page names, what the Helm chart registers by default, the
upload expiry's error params, the wait reasons the batch and stall lists name, the dev-key
refusal, and the file store's key layout."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from api.errors import InvalidRequest, SearchAttributeMissing
from api.files.files_api import check_expiry
from backfill.files import Store
from backfill.routes.reasons import WaitReason
from tests.stores import indexed_batch

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").glob("*.md")])
"""The pages a user or an operator reads (the decision records are history, not claims)."""


def read(name: str) -> str:
    return (ROOT / name).read_text()


def blocks(text: str) -> Iterator[str]:
    """Paragraphs, list items and table rows, each with its lines joined by single spaces."""
    for para in re.split(r"\n\s*\n", text):
        for item in re.split(r"\n(?=\s*(?:[-*] |\d+\. |\|))", para):
            yield " ".join(item.split())


def list_item(text: str, opening: str) -> str:
    """The top-level list item that starts with `opening`, with what is indented under it."""
    start = text.index(f"\n{opening}") + 1
    end = re.compile(r"\n(?=\S)").search(text, start)
    return " ".join(text[start : end.start() if end else len(text)].split())


def test_a_missing_search_attribute_is_answered_as_the_pages_say() -> None:
    err = SearchAttributeMissing("BackfillWorkspace")
    said = []
    for page in PAGES:
        for block in blocks(page.read_text()):
            if re.search(r"search.attribute", block, re.I) and re.search(
                r"missing|without it|lacks", block, re.I
            ):
                said += [(page.name, *m) for m in re.findall(r"answers (\d{3}) `([a-z_]+)`", block)]
    assert said, "no page says what a missing search attribute answers"
    for page, status, code in said:
        assert (int(status), code) == (err.status, err.code), (page, status, code)


def test_every_tag_a_page_names_is_in_the_repository() -> None:
    """Versions come from pyproject.toml; a page names a tag only if `git tag` lists it."""
    found = subprocess.run(
        ["git", "-C", str(ROOT), "tag", "--list"], capture_output=True, text=True, check=False
    )
    if found.returncode != 0:
        pytest.skip("not a git checkout")
    tags = set(found.stdout.split())
    named = []
    for page in [*PAGES, ROOT / "deploy/CHECKLIST.md"]:
        text = page.read_text()
        named += [(page.name, t) for t in re.findall(r"`(v\d+\.\d+\.\d+)`", text)]
        named += [(page.name, t) for t in re.findall(r"\btagged (?:`?v?)(\d+\.\d+\.\d+)", text)]
        named += [(page.name, "any") for _ in re.findall(r"\bis tagged `v", text)]
    missing = [(page, t) for page, t in named if t not in tags and f"v{t}" not in tags]
    assert not missing, f"pages name tags the repository does not carry: {missing}"


def test_the_pages_say_whether_the_chart_registers_the_search_attributes() -> None:
    values = yaml.safe_load(read("deploy/helm/backfill/values.yaml"))
    enabled = values["temporal"]["registerSearchAttributes"]["enabled"]
    seen = 0
    for name in ("docs/upgrading.md", "docs/operator-guide.md"):
        for block in blocks(read(name)):
            if "registerSearchAttributes" in block or "search-attribute Job" in block:
                seen += 1
                assert ("off by default" in block) == (not enabled), (name, block)
    assert seen >= 2


def test_the_upload_expiry_errors_name_the_params_the_reference_names() -> None:
    row = next(b for b in blocks(read("docs/api.md")) if b.startswith("| `POST /v1/files` |"))
    answers = row.split(" | ")[-1]
    guide = " ".join(read("docs/batches.md").split())
    for anchor, seconds in (("updated_at", 3600), ("created_at", 59), ("created_at", "x")):
        with pytest.raises(InvalidRequest) as err:
            check_expiry(anchor, seconds, "expires_after")
        assert f"`{err.value.param}`" in answers, err.value.param
        assert f"`{err.value.param}`" in guide, err.value.param


@pytest.mark.parametrize("reason", list(WaitReason), ids=lambda r: r.name)
def test_every_wait_reason_is_in_the_batch_guide_and_the_stall_clock(reason: WaitReason) -> None:
    assert f"`{reason.value}`" in list_item(
        read("docs/batches.md"), "- `reason`, `reason_detail` and `queue_position`"
    )
    stall = [b for b in blocks(read("docs/metrics.md")) if "**unless**" in b]
    assert len(stall) == 1
    counted = next(
        b for b in blocks(read("docs/metrics.md")) if b.startswith("- `Server metrics unavailable`")
    )
    # A legitimate wait is named where the clock stops; any other where it counts.
    assert f"`{reason.value}`" in (stall[0] if reason.legitimate else counted)


def test_the_dev_key_refusal_is_described_one_way() -> None:
    """Every page that says the dev keys are refused says when they are not: a development
    stack (`BACKFILL_DEV_STACK=1`) listening on loopback (`check_exposure`; its behaviour is
    tested in tests/unit/test_dev_keys.py)."""
    described = 0
    for page in [*PAGES, ROOT / "deploy/CHECKLIST.md"]:
        for block in blocks(page.read_text()):
            about_keys = re.search(r"dev keys?\b|repository's `backfill\.toml`", block)
            if about_keys and re.search(r"refuses|served only|only then may", block, re.I):
                described += 1
                assert "BACKFILL_DEV_STACK" in block and "loopback" in block, (page.name, block)
    assert described >= 4


def store_templates() -> list[re.Pattern[str]]:
    """The keys docs/storage.md lists, `<...>` standing for any name."""
    text = read("docs/storage.md")
    layout = text[text.index("### Keys") :]
    layout = layout[layout.index("```") + 3 :]
    layout = layout[: layout.index("```")]
    out = []
    for line in layout.strip().splitlines():
        key = re.match(r"(?:<[^>]*>|\S)+", line)  # a placeholder may hold spaces
        if key:
            parts = re.split(r"<[^>]+>", key.group(0))
            out.append(re.compile("[^/]+".join(map(re.escape, parts))))
    return out


def test_every_key_the_store_writes_is_in_the_storage_page(s3: Store) -> None:
    file_id = indexed_batch(s3, "batch_k", [b'{"a":1}', b'{"a":2}'])
    s3.commit_result("batch_k", 0, b"{}")
    s3.put_partial("batch_k", 1, b'{"text": "Once"}')
    s3.write_finalized("batch_k", b'{"total": 2}')
    keys = s3.keys("")
    assert f"files/{file_id}.data" in keys and any("/partials/" in k for k in keys)
    templates = store_templates()
    missing = [k for k in keys if not any(t.fullmatch(k) for t in templates)]
    assert not missing, f"docs/storage.md does not list these keys: {missing}"


def prerequisites(target: str) -> list[str]:
    found = re.search(rf"^{target}:([^\n]*)", read("Makefile"), re.M)
    assert found, target
    return found.group(1).split()


def test_the_readme_s_two_commands_are_two_and_say_what_they_need() -> None:
    text = read("README.md")
    start = text.index("\n## Two commands\n")
    section = text[start : text.index("\n## ", start + 1)]
    fence = section[section.index("```sh") : section.index("```\n", section.index("```sh") + 5)]
    assert re.findall(r"^make (\w+)", fence, re.M) == ["run", "test"]
    for target in ("test", "check"):
        tools = [p for p in prerequisites(target) if p in ("promtool", "chromium")]
        assert tools or target == "check"
        for tool in tools:
            assert any(f"`make {target}`" in b and tool in b for b in blocks(section)), (
                f"README does not say that make {target} needs {tool}"
            )
