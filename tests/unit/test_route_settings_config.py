"""Route settings as code (backfill.routes.settings, decision 0039): a route's `settings` table in
the config file is validated at load as a PUT would be, failing with the route and the field;
it is applied when the scheduler starts and again only when it changes; between changes a PUT
wins; and every setting says where it came from."""

from __future__ import annotations

from pathlib import Path

import pytest

from backfill.platform.config import ConfigError, load_settings
from backfill.routes.scheduler_client import scheduler_input
from backfill.routes.settings import (
    ConfiguredSettings,
    RouteSettings,
    after_put,
    apply_config,
    initial,
    sources_of,
)

ROUTE = """
[[models]]
id = "m"
[[models.routes]]
id = "r1"
base_url = "http://127.0.0.1:8100/v1"
[[models.routes]]
id = "gpu-b"
base_url = "http://127.0.0.1:8101/v1"
"""


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("BACKFILL_CONFIG", "GATEWAY_LOCAL_UPSTREAMS"):
        monkeypatch.delenv(name, raising=False)


def load(tmp_path: Path, text: str) -> object:
    path = tmp_path / "backfill.toml"
    path.write_text(ROUTE + text)
    return load_settings(path)


def test_a_settings_table_loads_and_starts_the_scheduler_with_its_sources(tmp_path: Path) -> None:
    settings = load(
        tmp_path,
        "max_concurrent_lines = 6\n"
        "[models.routes.settings]\npriority_hint = 100\n"
        "[models.routes.settings.seat_aware]\nseats = 8\nkeep_free = 2\n",
    )
    inp = scheduler_input(settings, "gpu-b")  # type: ignore[arg-type]
    assert inp.settings.max_concurrent_lines == 6
    assert inp.settings.priority_hint == 100
    assert inp.settings.model_dump()["seat_aware"] == {"seats": 8, "keep_free": 2}
    assert inp.configured == {"priority_hint": 100, "seat_aware": {"seats": 8, "keep_free": 2}}
    sources = sources_of(inp.settings, inp.sources)
    assert sources["max_concurrent_lines"] == "config"
    assert sources["priority_hint"] == sources["seat_aware"] == "config"
    assert sources["preempt"] == sources["reopen_ramp"] == "default"
    # A route without a table: its cap is the default, and says so.
    other = scheduler_input(settings, "r1")  # type: ignore[arg-type]
    assert other.configured == {}
    assert set(sources_of(other.settings, other.sources).values()) == {"default"}


@pytest.mark.parametrize(
    ("table", "field", "why"),
    [
        (
            "[models.routes.settings.preempt]\nmax_preemptions = 0\n",
            "models.0.routes.1.settings.preempt.max_preemptions",
            "greater than or equal to 1",
        ),
        ("[models.routes.settings]\nbogus = 1\n", "models.0.routes.1.settings.bogus", "Extra"),
        (
            "[models.routes.settings.seat_aware]\nseats = 4\nkeep_free = 4\n",
            "models.0.routes.1.settings.seat_aware",
            "keep_free",
        ),
    ],
)
def test_a_bad_field_fails_at_load_naming_the_route_and_the_field(
    tmp_path: Path, table: str, field: str, why: str
) -> None:
    with pytest.raises(ConfigError) as err:
        load(tmp_path, table)
    message = str(err.value)
    assert f"{field} (route 'gpu-b' of model 'm')" in message, message
    assert why in message, message
    assert "Value error," not in message


def test_what_a_put_refuses_the_file_refuses_too(tmp_path: Path) -> None:
    where = (
        r"models\.0\.routes\.1\.settings\.server_load\.metrics_url \(route 'gpu-b' of model 'm'\)"
    )
    with pytest.raises(ConfigError, match=where + ": metrics URL .* is not allowed"):
        load(
            tmp_path,
            "[models.routes.settings.server_load]\n"
            'metrics_url = "http://10.9.9.9:1/metrics"\nmax_waiting = 4\n',
        )
    openai_route = ROUTE.replace('id = "gpu-b"', 'id = "gpu-b"\nprovider = "openai"')
    path = tmp_path / "openai.toml"
    path.write_text(openai_route + "[models.routes.settings]\npriority_hint = 5\n")
    with pytest.raises(ConfigError, match=r"settings\.priority_hint \(route 'gpu-b'.*openai"):
        load_settings(path)


def test_the_cap_is_set_in_one_place(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="max_concurrent_lines is set both"):
        load(
            tmp_path,
            "max_concurrent_lines = 4\n[models.routes.settings]\nmax_concurrent_lines = 8\n",
        )


def configured(**declared: object) -> ConfiguredSettings:
    return ConfiguredSettings(declared=declared)


def test_a_put_wins_until_the_table_changes() -> None:
    start = initial(configured(priority_hint=100))
    assert start.settings.priority_hint == 100
    # A PUT: the field it changed comes from the admin API, the others keep their source.
    put = start.settings.model_copy(update={"priority_hint": 5})
    sources = after_put(start.settings, put, start.sources)
    assert sources["priority_hint"] == "admin_api"
    assert sources["max_concurrent_lines"] == "default"
    # The same table again (a worker restarted): nothing changes, the PUT stays.
    assert apply_config(put, sources, start.declared, configured(priority_hint=100)) is None
    # A changed table: applied whole, over the PUT.
    changed = apply_config(put, sources, start.declared, configured(priority_hint=200))
    assert changed is not None
    assert changed.settings.priority_hint == 200
    assert changed.sources["priority_hint"] == "config"
    assert changed.declared == {"priority_hint": 200}


def test_a_field_the_table_drops_returns_to_its_default_unless_a_put_set_it() -> None:
    start = initial(configured(priority_hint=100, reopen_ramp={"initial": 2, "double_every_s": 5}))
    put = start.settings.model_copy(update={"priority_hint": 7})
    sources = after_put(start.settings, put, start.sources)
    dropped = apply_config(put, sources, start.declared, configured())
    assert dropped is not None
    assert dropped.settings.model_dump()["reopen_ramp"] is None
    assert dropped.sources["reopen_ramp"] == "default"
    assert dropped.settings.priority_hint == 7  # the PUT's, kept
    assert dropped.sources["priority_hint"] == "admin_api"


def test_a_scheduler_from_before_settings_as_code() -> None:
    """Started before sources were kept: its cap came from the file when it still equals the
    file's; other non-default values could only come from a PUT."""
    old = RouteSettings(max_concurrent_lines=6, priority_hint=9)
    assert sources_of(old, {})["priority_hint"] == "admin_api"
    kept = apply_config(old, {}, None, ConfiguredSettings(cap=6))
    assert kept is not None and kept.settings == old and kept.declared == {}
    assert kept.sources["max_concurrent_lines"] == "config"
    assert kept.sources["priority_hint"] == "admin_api"
    # A table added since the upgrade is applied at the next worker start.
    added = apply_config(old, {}, None, ConfiguredSettings(cap=6, declared={"priority_hint": 1}))
    assert added is not None and added.settings.priority_hint == 1
