"""backfill.platform.config: the checked-in backfill.toml loads; bad files fail naming the field."""

from __future__ import annotations

import hmac
from pathlib import Path

import pytest

from backfill.platform.config import ConfigError, Settings, hash_key, load_settings

REPO = Path(__file__).resolve().parents[2]
DEV_TOML = REPO / "backfill.toml"

ENV_VARS = [
    "BACKFILL_CONFIG",
    "BACKFILL_DATA_DIR",
    "TEMPORAL_ADDRESS",
    "TEMPORAL_NAMESPACE",
    "TEMPORAL_API_KEY",
    "TEMPORAL_TLS",
    "TEMPORAL_TLS_CERT",
    "TEMPORAL_TLS_KEY",
    "BACKFILL_TASK_QUEUE",
    "BACKFILL_API_HOST",
    "BACKFILL_API_PORT",
    "BACKFILL_WORKER_MAX_CONCURRENT_ACTIVITIES",
]

ROUTE = """
[[models]]
id = "m"
[[models.routes]]
id = "r1"
base_url = "http://127.0.0.1:8100/v1"
"""


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "backfill.toml"
    path.write_text(text)
    return path


def test_dev_toml_loads() -> None:
    s = load_settings(DEV_TOML)
    assert s.data_dir == Path("data")
    assert s.temporal_address == "127.0.0.1:7233"
    assert s.limits.max_file_bytes == 209715200
    assert s.limits.max_lines_per_batch == 50000
    route = s.route("demo-sim")
    assert route is not None
    assert route.provider == "vllm"
    assert route.base_url == "http://127.0.0.1:8100/v1"
    assert route.max_concurrent_lines == 4
    model = s.model("demo")
    assert model is not None and [r.id for r in model.routes] == ["demo-sim"]
    key = s.key_for("sk-backfill-dev")
    assert key is not None
    assert (key.workspace, key.role, key.name) == ("default", "platform_admin", "dev")
    assert s.key_for("sk-wrong") is None


def test_backfill_config_env_names_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, 'data_dir = "elsewhere"\n' + ROUTE)
    monkeypatch.setenv("BACKFILL_CONFIG", str(path))
    s = load_settings()
    assert s.data_dir == Path("elsewhere")
    assert s.route("r1") is not None


def test_unknown_route_field_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, ROUTE + 'bogus = "x"\n')
    with pytest.raises(ConfigError, match=r"models\.0\.routes\.0\.bogus"):
        load_settings(path)


def test_unknown_top_level_field_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, "temporal_adress = 'typo:7233'\n")
    with pytest.raises(ConfigError, match="temporal_adress"):
        load_settings(path)


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ('provider = "x"', "models.0.routes.0.provider"),
        ("max_concurrent_lines = 0", "models.0.routes.0.max_concurrent_lines"),
        ('base_url = "ftp://nope"', "models.0.routes.0.base_url"),
        ("weight = 0", "models.0.routes.0.weight"),
    ],
)
def test_invalid_value_is_named(tmp_path: Path, line: str, field: str) -> None:
    text = (
        ROUTE.replace('base_url = "http://127.0.0.1:8100/v1"\n', "")
        if "base_url" in line
        else ROUTE
    )
    path = write(tmp_path, text + line + "\n")
    with pytest.raises(ConfigError) as err:
        load_settings(path)
    assert field in str(err.value)


def test_invalid_limit_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, "[limits]\nmax_file_bytes = 0\n")
    with pytest.raises(ConfigError, match=r"limits\.max_file_bytes"):
        load_settings(path)


def test_duplicate_route_ids_fail(tmp_path: Path) -> None:
    path = write(tmp_path, ROUTE + ROUTE.replace('id = "m"', 'id = "m2"'))
    with pytest.raises(ConfigError, match="duplicate route id"):
        load_settings(path)


def test_env_overrides_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, 'temporal_address = "file:7233"\napi_port = 8000\n')
    assert load_settings(path).temporal_address == "file:7233"
    monkeypatch.setenv("TEMPORAL_ADDRESS", "env-host:7233")
    monkeypatch.setenv("BACKFILL_API_PORT", "9001")
    s = load_settings(path)
    assert s.temporal_address == "env-host:7233"
    assert s.api_port == 9001


def test_missing_backfill_config_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "nope.toml"
    monkeypatch.setenv("BACKFILL_CONFIG", str(missing))
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings()


def test_no_file_without_backfill_config_gives_defaults(tmp_path: Path) -> None:
    s = load_settings(tmp_path / "absent.toml")
    assert s.temporal_address == "127.0.0.1:7233"
    assert s.models == []


def test_invalid_toml_fails(tmp_path: Path) -> None:
    path = write(tmp_path, "this is = = not toml\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings(path)


def test_hash_key() -> None:
    # SHA-256 test vector for "abc".
    assert hash_key("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert hash_key("sk-backfill-dev") in DEV_TOML.read_text()


def test_only_documented_environment_names_are_read(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Stray variables (lower-case field names, MODELS, DATA_DIR) never change the config."""
    from backfill.platform.config import load_settings as load

    for name, value in {
        "api_port": "1",
        "data_dir": "/stray",
        "DATA_DIR": "/stray",
        "MODELS": "[]",
        "BACKFILL_models": "[]",
        "BACKFILL_limits": "{}",
        "task_queue": "stray",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("BACKFILL_CONFIG", raising=False)
    s = load(Path("backfill.toml"))
    assert s.api_port == 8000 and str(s.data_dir) == "data" and s.task_queue == "backfill"
    assert [m.id for m in s.models] == ["demo"]
    monkeypatch.setenv("BACKFILL_API_PORT", "9001")
    assert load(Path("backfill.toml")).api_port == 9001


def test_keys_are_compared_in_constant_time_against_every_hash(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    keys = [{"sha256": hash_key(f"k{i}"), "workspace": f"w{i}"} for i in range(5)]
    settings = Settings(api_keys=keys)
    calls: list[bytes] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append(a)
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", counting)
    found = settings.key_for("k1")
    assert found is not None and found.workspace == "w1"
    assert len(calls) == 5  # no early exit on the match
    calls.clear()
    assert settings.key_for("nope") is None and len(calls) == 5
