"""What the api and the worker say at start: a route key variable that is unset, and the log
level that reaches uvicorn."""

from __future__ import annotations

import logging
from typing import Any

import pytest

import api.main
from backfill.platform.config import ModelConfig, RouteConfig, Settings, missing_upstream_keys


class NoServer:
    """Stands in for uvicorn.Server: records the config `api.main.run` built, serves nothing."""

    configs: list[Any] = []

    def __init__(self, config: Any) -> None:
        NoServer.configs.append(config)
        self.started = True

    def run(self) -> None:
        pass


@pytest.fixture(autouse=True)
def _no_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(api.main.uvicorn, "Server", NoServer)


def settings_with_key_env(name: str | None) -> Settings:
    route = RouteConfig(id="vllm-a", base_url="http://10.0.0.5:8000/v1", api_key_env=name)
    return Settings(models=[ModelConfig(id="m", routes=[route])])


def test_unset_or_empty_key_variable_is_missing() -> None:
    s = settings_with_key_env("VLLM_KEY")
    assert missing_upstream_keys(s, {}) == [("vllm-a", "VLLM_KEY")]
    assert missing_upstream_keys(s, {"VLLM_KEY": ""}) == [("vllm-a", "VLLM_KEY")]
    assert missing_upstream_keys(s, {"VLLM_KEY": "secret"}) == []
    assert missing_upstream_keys(settings_with_key_env(None), {}) == []


def test_api_start_warns_about_an_unset_key_variable_without_values(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("BACKFILL_TEST_UNSET_KEY", raising=False)
    with caplog.at_level(logging.WARNING):
        api.main.run(settings_with_key_env("BACKFILL_TEST_UNSET_KEY"))
    assert "'vllm-a'" in caplog.text and "BACKFILL_TEST_UNSET_KEY" in caplog.text


def test_no_warning_when_the_variable_is_set(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("BACKFILL_TEST_SET_KEY", "sk-upstream-value")
    with caplog.at_level(logging.WARNING):
        api.main.run(settings_with_key_env("BACKFILL_TEST_SET_KEY"))
    assert "BACKFILL_TEST_SET_KEY" not in caplog.text
    assert "sk-upstream-value" not in caplog.text


@pytest.mark.parametrize("level", [logging.DEBUG, logging.WARNING])
def test_uvicorn_gets_the_configured_log_level(monkeypatch: pytest.MonkeyPatch, level: int) -> None:
    root = logging.getLogger()
    monkeypatch.setattr(root, "level", level)
    api.main.run(Settings())
    assert NoServer.configs[-1].log_level == level
