"""Loading the settings: the TOML file named by `BACKFILL_CONFIG` (or `backfill.toml`) and the
environment, with a `ConfigError` naming the field when either is wrong."""

from __future__ import annotations

import os
import tomllib
from functools import lru_cache
from pathlib import Path

from pydantic import ValidationError
from pydantic_settings import SettingsError

from backfill.platform.config.settings import Settings


class ConfigError(Exception):
    """The configuration is unknown or invalid; the message names the field."""


def config_path() -> Path:
    return Path(os.environ.get("BACKFILL_CONFIG", "backfill.toml"))


def load_settings(path: Path | None = None) -> Settings:
    """Read the TOML file (if it exists) and the environment; raise ConfigError naming the field."""
    path = path or config_path()
    data: dict[str, object] = {}
    if path.exists():
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: not valid TOML: {e}") from e
    elif "BACKFILL_CONFIG" in os.environ:
        raise ConfigError(f"BACKFILL_CONFIG names {path}, which does not exist")
    try:
        return Settings(**data)  # type: ignore[arg-type]
    except SettingsError as e:
        raise ConfigError(f"invalid environment variable: {e}") from None
    except ValidationError as e:
        problems = "; ".join(_problem(data, err["loc"], err["msg"]) for err in e.errors())
        raise ConfigError(f"{path}: invalid configuration: {problems}") from None


def _problem(data: object, loc: tuple[int | str, ...], msg: str) -> str:
    """One validation error as `where: what`. Where: the field's path, then the route (and model)
    it belongs to by id, e.g. `models.0.routes.1.weight (route 'gpu-b' of model 'demo')`; a check
    of the whole file names its own place."""
    msg = msg.removeprefix("Value error, ")
    if not loc:
        return msg
    ids: dict[str, str] = {}
    node = data
    for prev, p in zip((None, *loc), loc, strict=False):
        node = node[p] if _has(node, p) else None  # type: ignore[index]
        if isinstance(p, int) and isinstance(node, dict) and isinstance(node.get("id"), str):
            ids[str(prev)] = node["id"]
    where = ".".join(str(p) for p in loc)
    if "routes" in ids and "models" in ids:
        where += f" (route {ids['routes']!r} of model {ids['models']!r})"
    elif "models" in ids:
        where += f" (model {ids['models']!r})"
    return f"{where}: {msg}"


def _has(node: object, key: int | str) -> bool:
    if isinstance(node, list):
        return isinstance(key, int) and 0 <= key < len(node)
    return isinstance(node, dict) and key in node


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, loaded once. Tests pass their own Settings instead."""
    return load_settings()
