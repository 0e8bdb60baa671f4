"""Keep the reference docs honest where a test can: every environment variable the settings read
is in docs/configuration.md, and every error code the api, the input validation and the line
activity can produce is in docs/api.md. Codes and names are read from the source, so a new one
fails here until it is documented."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from backfill.config import Settings

ROOT = Path(__file__).resolve().parents[2]
API_CODE = re.compile(r'code="([a-z_]+)"')
"""`code="..."` in an APIError, a BodyRule or a BatchError."""
GATEWAY_CODE = re.compile(r'_gateway_error\([^)]*"([a-z_]+)"\)', re.S)
ENVELOPE_CODE = re.compile(r'"code": "([a-z_]+)"')
LINE_CODE = re.compile(r'_failed\(\s*custom_id,\s*line_no,\s*"([a-z_]+)"')
FINAL_CODE = re.compile(r'"(batch_cancelled|batch_expired|internal_error)"')


def doc(name: str) -> str:
    return (ROOT / "docs" / name).read_text()


def source(*globs: str) -> str:
    return "\n".join(p.read_text() for g in globs for p in sorted(ROOT.glob(g)))


def settings_env_names() -> set[str]:
    names = set()
    for field in Settings.model_fields.values():
        alias = field.validation_alias
        if isinstance(alias, str):
            names.add(alias)
    return names


def api_codes() -> set[str]:
    api = source("api/*.py")
    return set(API_CODE.findall(api) + GATEWAY_CODE.findall(api) + ENVELOPE_CODE.findall(api))


def test_the_settings_read_environment_variables() -> None:
    # The extraction itself: a regression here would make the next test vacuous.
    assert {"BACKFILL_DATA_DIR", "TEMPORAL_ADDRESS", "BACKFILL_API_HOST"} <= settings_env_names()
    assert len(settings_env_names()) >= 15


@pytest.mark.parametrize("name", sorted(settings_env_names()))
def test_every_settings_variable_is_documented(name: str) -> None:
    assert f"`{name}`" in doc("configuration.md"), f"{name} is not in docs/configuration.md"


@pytest.mark.parametrize("name", ["BACKFILL_CONFIG", "BACKFILL_LOG_LEVEL"])
def test_variables_read_outside_the_settings_are_documented(name: str) -> None:
    assert f"`{name}`" in doc("configuration.md")


def test_the_api_answers_codes() -> None:
    codes = api_codes()
    assert {"read_only", "insufficient_role", "request_too_large", "upstream_timeout"} <= codes
    assert len(codes) >= 12


@pytest.mark.parametrize("code", sorted(api_codes()))
def test_every_api_error_code_is_in_the_reference(code: str) -> None:
    assert f"`{code}`" in doc("api.md"), f"error code {code} is not in docs/api.md"


def input_and_line_codes() -> set[str]:
    input_codes = set(API_CODE.findall(source("backfill/input_rules.py")))
    line_codes = set(LINE_CODE.findall(source("activities/lines.py")))
    final = set(FINAL_CODE.findall(source("activities/finalizing.py")))
    give_up = set(re.findall(r'give_up_code="([a-z_]+)"', source("workflows/*.py")))
    return input_codes | line_codes | final | give_up


def test_input_and_line_codes_are_found() -> None:
    codes = input_and_line_codes()
    assert {"unknown_model", "request_timeout", "line_lost", "batch_expired"} <= codes


@pytest.mark.parametrize("code", sorted(input_and_line_codes()))
def test_every_input_and_line_code_is_in_the_reference(code: str) -> None:
    assert f"`{code}`" in doc("api.md"), f"code {code} is not in docs/api.md"
