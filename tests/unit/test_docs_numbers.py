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


WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8}


def test_the_count_of_search_attributes() -> None:
    from backfill.batches.search_attributes import ALL

    text = doc("docs/operator-guide.md")
    counts = re.findall(r"the (\w+) search attributes", text) + re.findall(
        r"expect all (\w+)", text
    )
    stated = [WORDS[w] for w in counts if w in WORDS]
    assert stated, "docs/operator-guide.md no longer counts them: drop this test"
    assert set(stated) == {len(ALL)}, counts


def test_the_s3_result_key_layout() -> None:
    from backfill.files.s3 import S3Store

    store = S3Store(client=None, bucket="b", prefix="p/")
    key = store._result_key("batch_x", 12345)
    assert key == "p/batches/batch_x/results/00012/12345.json"
    text = doc("docs/storage.md")
    assert "results/00012/12345.json" in text
    assert "batches/<batch id>/results/<line // 1000, 5 digits>/<line>.json" in text


def test_the_pace_window() -> None:
    from backfill.batches.eta import RECENT_SECONDS

    minutes = RECENT_SECONDS / 60
    for page, pattern in (
        ("docs/cli.md", r"over the last (\w+) minutes of what the CLI saw"),
        ("docs/batches.md", r"per second over the last (\d+) minutes"),
        ("docs/metrics.md", r"per second over the last (\d+) minutes"),
    ):
        found = re.findall(pattern, doc(page))
        assert found, f"{page} no longer states the window"
        assert {WORDS.get(w) or int(w) for w in found} == {minutes}, (page, found)
