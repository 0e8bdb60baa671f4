"""Each process's worst-case memory, summed from the code's own bounds and the settings the Helm
chart gives it, fits the memory limit the chart sets (issue 47: the api buffered up to 16 MB of
each live answer × 256 in flight per workspace, workers 512 lines × 8 MB answers, against
limits of 1 and 2 GiB). And docs/operator-guide.md, "Memory budget per process", states these
very numbers.

Every part is a bound of the process, not of a request or a workspace: a budget every such
buffer draws on (`backfill.tenancy.byte_budget`), or a count the process caps (threads, connections,
the event loop decoding one thing at a time) times a per-item cap."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT

from activities.lines.run_line import ANSWER_COPIES, BUFFER_WAIT_SECONDS, REQUEST_COPIES
from api.app import UPSTREAM_LIMITS
from api.batches.results import PAGE_BYTES, PAGE_READERS
from api.live.proxy import ERROR_BODY_LIMIT
from api.live.relay import UNCHARGED_CHUNK_BYTES
from api.live.usage_counts import DECODED_COPIES, MAX_JSON_BYTES
from api.middleware import BODY_COPIES
from backfill.batches.jobs import RECORD_HEAD_BYTES
from backfill.batches.streamed_answer import MAX_EVENT_BYTES
from backfill.platform.config import Settings
from backfill.tenancy.byte_budget import API_BASELINE_BYTES, WORKER_BASELINE_BYTES
from tests.unit.test_deploy import ROOT, render_chart

MiB = 1 << 20
ASYNCIO_WRITE_HIGH_WATER = 64 * 1024
"""asyncio's default write buffer high-water mark per transport (not exported by asyncio):
uvicorn's `send` waits past it, so a slow reader holds at most this much of an answer."""
UNITS = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}


def api_parts(s: Settings) -> dict[str, int]:
    """The api's worst case, part by part (bytes)."""
    largest_record = s.limits.max_response_bytes + RECORD_HEAD_BYTES
    return {
        "baseline": API_BASELINE_BYTES,
        "request bodies and answers": s.api_buffer_bytes,
        "live answers kept for usage": s.api_usage_buffer_bytes,
        "live answers held for slow clients": s.limits.live_buffer_total_bytes
        + s.api_max_concurrency * UNCHARGED_CHUNK_BYTES,
        "decoding one kept answer": MAX_JSON_BYTES * DECODED_COPIES,
        "upstream error bodies": (UPSTREAM_LIMITS.max_connections or 0) * ERROR_BODY_LIMIT,
        "results pages being built": PAGE_READERS * 2 * (PAGE_BYTES + largest_record),
        "connections' socket buffers": s.api_max_concurrency
        * (HIGH_WATER_LIMIT + ASYNCIO_WRITE_HIGH_WATER),
    }


def worker_parts(s: Settings, role: str) -> dict[str, int]:
    """A worker's worst case, part by part (bytes); a `workflows` worker runs no lines."""
    if role == "workflows":
        return {"baseline": WORKER_BASELINE_BYTES}
    return {
        "baseline": WORKER_BASELINE_BYTES,
        "running lines' requests and answers": s.worker_buffer_bytes,
        "streamed lines' unended events": s.worker_max_concurrent_activities * MAX_EVENT_BYTES,
    }


def _bytes(quantity: str) -> int:
    number, unit = re.fullmatch(r"(\d+)([KMG]i)", quantity).groups()  # type: ignore[union-attr]
    return int(number) * UNITS[unit]


def _containers(values: dict[str, Any] | None) -> list[tuple[str, dict[str, Any]]]:
    """(Deployment name, its backfill container) of the rendered chart."""
    out = []
    for docs in render_chart(values).values():
        for doc in docs:
            if doc.get("kind") == "Deployment":
                [container] = doc["spec"]["template"]["spec"]["containers"]
                out.append((doc["metadata"]["name"], container))
    return out


def _settings(container: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The settings the container's process runs with: the defaults, and the chart's env."""
    for var in container.get("env", []):
        if var["name"].startswith("BACKFILL_") and "value" in var:
            monkeypatch.setenv(var["name"], str(var["value"]))
    return Settings()


def _parts(name: str, container: dict[str, Any], s: Settings) -> dict[str, int]:
    if name.endswith("-api"):
        return api_parts(s)
    role = "workflows" if name.endswith("-worker-workflows") else "activities"
    return worker_parts(s, role)


@pytest.mark.parametrize("split", [False, True])
def test_every_process_fits_the_memory_limit_the_chart_sets(
    split: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    values = {"worker": {"split": {"enabled": True}}} if split else None
    seen = []
    for name, container in _containers(values):
        if name.endswith("search-attributes"):
            continue
        with monkeypatch.context() as env:
            parts = _parts(name, container, _settings(container, env))
        limit = _bytes(container["resources"]["limits"]["memory"])
        total = sum(parts.values())
        assert total <= limit, (
            f"{name}: worst case {total / MiB:.0f} MiB, limit {limit / MiB:.0f} MiB: {parts}"
        )
        seen.append(name)
    assert any(n.endswith("-api") for n in seen) and any("-worker" in n for n in seen)


def _section() -> str:
    text = (ROOT / "docs" / "operator-guide.md").read_text()
    return text.split("### Memory budget per process", 1)[1].split("\n#", 1)[0]


def _doc_rows() -> dict[tuple[str, str], int]:
    section = _section()
    rows = re.findall(r"^\| (api|worker) \| ([^|]+?) \| \**([\d,]+)\** \|", section, re.M)
    return {(p, part.strip("* ")): int(mib.replace(",", "")) for p, part, mib in rows}


def test_the_operator_guide_states_these_numbers() -> None:
    s = Settings()
    rows = _doc_rows()
    for process, parts in (("api", api_parts(s)), ("worker", worker_parts(s, "all"))):
        for part, size in parts.items():
            assert rows.get((process, part)) == math.ceil(size / MiB), (process, part, rows)
        stated_total = rows.get((process, "total"))
        assert stated_total == math.ceil(sum(parts.values()) / MiB), (process, stated_total)
        assert {k for k in rows if k[0] == process} == {(process, p) for p in [*parts, "total"]}
    section = _section()
    words = {2: "twice", 3: "3 times"}
    claims = [
        f"counted {words[BODY_COPIES]} each",
        f"counted {words[REQUEST_COPIES]} its line, its answer {words[ANSWER_COPIES]}",
        f"{s.api_buffer_workspace_bytes // MiB} MiB per workspace (`api_buffer_workspace_bytes`)",
        f"{s.api_usage_buffer_workspace_bytes // MiB} MiB per workspace; each answer at most "
        f"{MAX_JSON_BYTES // MiB} MiB",
        f"{s.worker_buffer_workspace_bytes // MiB} MiB per workspace",
        f"waits up to {BUFFER_WAIT_SECONDS:g} s",
        f"reads at most {RECORD_HEAD_BYTES >> 10} KiB of its record",
    ]
    for claim in claims:
        assert claim in " ".join(section.split()), claim


def test_a_budget_over_the_limit_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above can fail: a worker given a larger buffer budget does not fit."""
    extra = [{"name": "BACKFILL_WORKER_BUFFER_BYTES", "value": str(1536 * MiB)}]
    [(name, container)] = [
        c for c in _containers({"worker": {"extraEnv": extra}}) if c[0].endswith("-worker")
    ]
    parts = _parts(name, container, _settings(container, monkeypatch))
    assert sum(parts.values()) > _bytes(container["resources"]["limits"]["memory"])
