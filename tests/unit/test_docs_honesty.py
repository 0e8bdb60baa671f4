"""Keep the reference docs honest where the code is the truth:

- docs/configuration.md: every setting of `backfill.platform.config` (the settings model and its
  tables) with its environment variable, its default and its range;
- docs/metrics.md: every metric the processes register, with its labels, and none that is not;
- docs/api.md: every path and method of the app's OpenAPI document, and none it lacks; every
  error code the api, the input validation and the line activity can produce;
- docs/operator-guide.md: every wait reason.

Names, defaults, bounds and codes are read from the code, so a change there fails here until the
page says the same."""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY, Counter
from prometheus_client.metrics import MetricWrapperBase
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from api.app import create_app
from backfill.platform.config import (
    ApiKeyConfig,
    Limits,
    ModelConfig,
    RouteConfig,
    Settings,
    WorkspaceLimits,
)
from backfill.routes.reasons import WaitReason

ROOT = Path(__file__).resolve().parents[2]
API_CODE = re.compile(r'code="([a-z_]+)"')
"""`code="..."` in an APIError, a BodyRule or a BatchError."""
GATEWAY_CODE = re.compile(r'_gateway_error\([^)]*"([a-z_]+)"\)', re.S)
ENVELOPE_CODE = re.compile(r'"code": "([a-z_]+)"')
LINE_CODE = re.compile(r'\bfailed\(\s*(?:custom_id,\s*line_no,\s*)?"([a-z_]+)"')
"""A line's own failure: `failed(custom_id, line_no, "...")`, or its attempt's `failed("...")`."""
FINAL_CODE = re.compile(r'"(batch_cancelled|batch_expired|internal_error)"')


def doc(name: str) -> str:
    return (ROOT / "docs" / name).read_text()


def source(*globs: str) -> str:
    return "\n".join(p.read_text() for g in globs for p in sorted(ROOT.glob(g)))


def table_rows(text: str) -> Iterator[list[str]]:
    """The cells of every Markdown table row of `text` (header and rule rows included)."""
    for line in text.splitlines():
        if line.startswith("|"):
            yield [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def section(text: str, heading: str) -> str:
    """The text under the `## heading` line, up to the next `## ` heading."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


# ---- Configuration ----

CONFIG_TABLES: dict[str, type[BaseModel]] = {
    "Top-level keys and their environment variables": Settings,
    "`[limits]`": Limits,
    "`[[models]]`": ModelConfig,
    "`[[models.routes]]`": RouteConfig,
    "`[[api_keys]]`": ApiKeyConfig,
    "`[workspaces.<name>]`": WorkspaceLimits,
}
"""Each section of docs/configuration.md and the model whose fields its table lists."""


def config_rows(heading: str) -> dict[str, str]:
    """`key` -> its whole row (cells joined), for the table under `## heading`."""
    rows = {}
    for cells in table_rows(section(doc("configuration.md"), heading)):
        key = re.fullmatch(r"`([a-z0-9_]+)`", cells[0])
        if key:
            rows[key.group(1)] = " | ".join(cells)
    return rows


def config_fields() -> list[tuple[str, str, FieldInfo]]:
    """(section heading, key, field) for every documented setting: every field of the models,
    except the tables that are documented as sections of their own."""
    out = []
    for heading, model in CONFIG_TABLES.items():
        for name, field in model.model_fields.items():
            if field.default_factory is not None:
                continue  # limits, models, api_keys, workspaces: sections of their own
            out.append((heading, name, field))
    return out


def number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def human_bytes(value: int) -> str | None:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= size and value % size == 0:
            return f"{value // size} {unit}"
    return None


def default_written(field: FieldInfo) -> list[str]:
    """Ways the page may state the field's default (any one will do)."""
    value = field.default
    if value is PydanticUndefined:
        return ["required"]
    if value is None:
        return ["none", "unset", "absent"]
    if isinstance(value, bool):
        return [f"`{str(value).lower()}`"]
    if isinstance(value, int | float):
        return [f"`{number(value)}`"]
    if value == "":
        return ["empty", '`""`']
    return [f"`{value}`"]


def bounds(field: FieldInfo) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for meta in field.metadata:
        for attr in ("ge", "gt", "le", "lt", "min_length", "max_length"):
            if getattr(meta, attr, None) is not None:
                found[attr] = getattr(meta, attr)
    return found


def range_written(field: FieldInfo) -> list[str]:
    """Ways the page may state the field's range; [] when the field has no bound."""
    b = bounds(field)
    low = b.get("ge", b.get("min_length"))
    high = b.get("le", b.get("max_length"))
    if low is not None and high is not None:
        return [f"{number(low)}–{number(high)}", f"{number(low)} to {number(high)}"]
    if "gt" in b:
        return [f"greater than {number(b['gt'])}"]
    if low is not None:
        forms = [f"at least {number(low)}", f"{number(low)} or more", f"≥ {number(low)}"]
        forms += [f"minimum {number(low)}"]
        human = human_bytes(int(low))
        if human:
            forms += [f"at least {human}"]
        return forms
    return []


def test_the_configuration_tables_are_found() -> None:
    # The extraction itself: a regression here would make the tests below vacuous.
    assert len(config_fields()) >= 50
    assert "max_concurrent_lines" in config_rows("`[[models.routes]]`")


@pytest.mark.parametrize(
    ("heading", "key", "field"),
    [pytest.param(h, k, f, id=f"{CONFIG_TABLES[h].__name__}.{k}") for h, k, f in config_fields()],
)
def test_every_setting_is_documented_with_its_default_and_range(
    heading: str, key: str, field: FieldInfo
) -> None:
    rows = config_rows(heading)
    assert key in rows, f"docs/configuration.md, {heading}: no row for `{key}`"
    row = rows[key].replace(",", "")  # 100,000 reads as 100000
    env = field.validation_alias
    if isinstance(env, str):
        assert f"`{env}`" in row, f"`{key}`: its environment variable {env} is not in its row"
    defaults = default_written(field)
    default_cell = rows[key].split(" | ")[2 if env else 1].lower()
    assert any(d.lower() in default_cell for d in defaults), (
        f"`{key}`: the default column says {default_cell!r}; the code's default is "
        f"{field.default!r} ({' or '.join(defaults)})"
    )
    ranges = range_written(field)
    if ranges:
        assert any(r.lower() in row.lower() for r in ranges), (
            f"`{key}`: its range ({bounds(field)}) is not stated as any of {ranges}"
        )


@pytest.mark.parametrize("name", ["BACKFILL_CONFIG", "BACKFILL_LOG_LEVEL", "BACKFILL_LOG_FORMAT"])
def test_variables_read_outside_the_settings_are_documented(name: str) -> None:
    assert f"`{name}`" in doc("configuration.md")
    assert name in source(
        "backfill/**/*.py", "backfill/platform/config/*.py", "api/**/*.py", "worker/**/*.py"
    )


# ---- Metrics ----


def registered_metrics() -> dict[str, tuple[str, ...]]:
    """Every metric the processes register (exposition name -> label names): every module of
    the packages that run in the api and the worker is imported, then the registry is read."""
    for package in ("backfill", "api", "worker", "activities"):
        path = importlib.import_module(package).__path__
        for info in pkgutil.walk_packages(path, f"{package}."):
            if not info.name.endswith("__main__"):
                importlib.import_module(info.name)
    found = {}
    for collector in list(REGISTRY._collector_to_names):
        if isinstance(collector, MetricWrapperBase):
            suffix = "_total" if isinstance(collector, Counter) else ""
            found[collector._name + suffix] = tuple(collector._labelnames)
    return found


def documented_metrics() -> dict[str, tuple[str, ...]]:
    """Metric name -> labels, from the first cell of docs/metrics.md's table rows."""
    found = {}
    for cells in table_rows(doc("metrics.md")):
        m = re.fullmatch(r"`([a-z_]+)(?:\{([a-z_,]*)\})?`( \(histogram\))?", cells[0])
        if m and m.group(1).startswith("gateway_"):
            found[m.group(1)] = tuple(filter(None, (m.group(2) or "").split(",")))
    return found


def test_metrics_are_found() -> None:
    assert {"gateway_live_in_flight", "gateway_batch_stall_seconds"} <= set(registered_metrics())
    assert len(documented_metrics()) >= 10


def test_every_registered_metric_is_documented_with_its_labels() -> None:
    documented = documented_metrics()
    for name, labels in registered_metrics().items():
        assert name in documented, f"metric {name} is not in docs/metrics.md"
        assert set(documented[name]) == set(labels), (
            f"{name}: docs/metrics.md says labels {documented[name]}, the code has {labels}"
        )


def test_no_documented_metric_is_unregistered() -> None:
    extra = set(documented_metrics()) - set(registered_metrics())
    assert not extra, f"docs/metrics.md documents metrics no process registers: {sorted(extra)}"


# ---- API reference ----

METHOD_PATH = re.compile(r"`(GET|POST|PUT|PATCH|DELETE) (/[^`\s]*)`")


def openapi_operations() -> set[str]:
    spec = create_app(Settings(), client=object()).openapi()  # type: ignore[arg-type]
    return {f"{m.upper()} {path}" for path, item in spec["paths"].items() for m in item}


def documented_operations() -> set[str]:
    """`METHOD /path` in the first cell of docs/api.md's table rows."""
    found = set()
    for cells in table_rows(doc("api.md")):
        for method, path in METHOD_PATH.findall(cells[0]):
            found.add(f"{method} {path}")
    return found


def test_operations_are_found() -> None:
    assert {"POST /v1/batches", "GET /healthz"} <= openapi_operations()
    assert len(documented_operations()) >= 25


def test_every_openapi_operation_is_in_the_api_reference() -> None:
    missing = openapi_operations() - documented_operations()
    assert not missing, f"docs/api.md lacks these operations of the app: {sorted(missing)}"


def test_the_api_reference_names_no_operation_the_app_lacks() -> None:
    extra = documented_operations() - openapi_operations()
    assert not extra, f"docs/api.md documents operations the app does not serve: {sorted(extra)}"


# ---- Error codes ----


def api_codes() -> set[str]:
    api = source("api/**/*.py")
    return set(API_CODE.findall(api) + GATEWAY_CODE.findall(api) + ENVELOPE_CODE.findall(api))


def test_the_api_answers_codes() -> None:
    codes = api_codes()
    assert {"read_only", "insufficient_role", "request_too_large", "upstream_timeout"} <= codes
    assert len(codes) >= 12


@pytest.mark.parametrize("code", sorted(api_codes()))
def test_every_api_error_code_is_in_the_reference(code: str) -> None:
    assert f"`{code}`" in doc("api.md"), f"error code {code} is not in docs/api.md"


def input_codes() -> set[str]:
    return set(API_CODE.findall(source("backfill/batches/input_rules.py")))


def input_and_line_codes() -> set[str]:
    line_codes = set(LINE_CODE.findall(source("activities/lines/*.py")))
    final = set(FINAL_CODE.findall(source("activities/finalizing.py")))
    give_up = set(re.findall(r'give_up_code="([a-z_]+)"', source("workflows/*.py")))
    return input_codes() | line_codes | final | give_up


def test_input_and_line_codes_are_found() -> None:
    codes = input_and_line_codes()
    assert {"unknown_model", "request_timeout", "line_lost", "batch_expired"} <= codes


@pytest.mark.parametrize("code", sorted(input_and_line_codes()))
def test_every_input_and_line_code_is_in_the_reference(code: str) -> None:
    assert f"`{code}`" in doc("api.md"), f"code {code} is not in docs/api.md"


def test_the_input_codes_listed_are_the_validators() -> None:
    listed = section(doc("api.md"), "Error codes").split("### Input codes")[1].split("###")[0]
    documented = set(re.findall(r"`([a-z_]+)`", listed)) - {"limits", "max_lines_per_batch"}
    assert documented == input_codes(), "docs/api.md's input codes differ from input_rules.py"


# ---- Wait reasons ----


@pytest.mark.parametrize("reason", list(WaitReason), ids=lambda r: r.name)
def test_every_wait_reason_is_in_the_operator_guide(reason: WaitReason) -> None:
    reasons = {cells[0] for cells in table_rows(doc("operator-guide.md"))}
    assert f"`{reason.value}`" in reasons, f"{reason.value!r} is not in the reasons table"


# ---- Links ----

LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(path: Path) -> set[str]:
    """GitHub's anchors for the headings of a Markdown file."""
    found = set()
    for line in path.read_text().splitlines():
        m = re.match(r"#+ (.*)", line)
        if m:
            text = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower().replace("`", ""))
            found.add(text.replace(" ", "-"))
    return found


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_reaches_its_file_and_heading(page: Path) -> None:
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        assert dest.exists(), f"{page.relative_to(ROOT)}: {target} names no file"
        if anchor and dest.suffix == ".md":
            assert anchor in anchors(dest), f"{page.relative_to(ROOT)}: {target}: no such heading"
