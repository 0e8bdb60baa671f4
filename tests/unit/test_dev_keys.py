"""The repository's public dev keys are served only by a stack that says it is a development
stack (issue 40): an api on loopback is not enough, since a proxy on the same host may put it on
the network."""

from __future__ import annotations

from pathlib import Path

import pytest

from backfill.platform.config import (
    Settings,
    UnsafeConfig,
    check_exposure,
    load_settings,
)

REPO = Path(__file__).resolve().parents[2]


def _dev_toml(monkeypatch: pytest.MonkeyPatch, **env: str) -> Settings:
    for var in ("BACKFILL_DEV_STACK", "BACKFILL_API_HOST"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    return load_settings(REPO / "backfill.toml")


def test_the_dev_keys_are_refused_on_loopback_without_a_dev_stack(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = _dev_toml(monkeypatch)
    assert settings.api_host == "127.0.0.1" and settings.shipped_dev_keys()
    with pytest.raises(UnsafeConfig, match="not a development stack"):
        check_exposure(settings)


def test_a_dev_stack_on_loopback_serves_them(monkeypatch: pytest.MonkeyPatch) -> None:
    check_exposure(_dev_toml(monkeypatch, BACKFILL_DEV_STACK="1"))


def test_a_dev_stack_off_loopback_is_still_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _dev_toml(monkeypatch, BACKFILL_DEV_STACK="1", BACKFILL_API_HOST="0.0.0.0")
    with pytest.raises(UnsafeConfig, match="0.0.0.0"):
        check_exposure(settings)


def test_keys_of_ones_own_need_no_declaration() -> None:
    check_exposure(Settings(api_host="0.0.0.0"))
