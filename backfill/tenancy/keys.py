"""New API keys for `backfill keys create`: a random key, shown once, and its config entry.

Only the key's SHA-256 goes into the config (with a key id, the workspace, the role and the
allowed models); the key itself is printed once and stored nowhere.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass

from backfill.platform.config import ApiKeyConfig, Role, hash_key

KEY_PREFIX = "sk-backfill-"


@dataclass(frozen=True)
class NewKey:
    key: str
    """The secret: give it to its holder; it is not recoverable."""
    entry: ApiKeyConfig
    """What the config's `[[api_keys]]` gains (hash only)."""

    def toml(self) -> str:
        """The `[[api_keys]]` table to add to backfill.toml."""
        e = self.entry
        lines = [
            "[[api_keys]]",
            f"id = {json.dumps(e.key_id)}",
            f"sha256 = {json.dumps(e.sha256)}",
            f"workspace = {json.dumps(e.workspace)}",
            f"role = {json.dumps(e.role)}",
        ]
        if e.name:
            lines.append(f"name = {json.dumps(e.name)}")
        if e.models is not None:
            lines.append(f"models = {json.dumps(e.models)}")
        return "\n".join(lines) + "\n"


def create_key(
    workspace: str, role: Role, models: list[str] | None = None, name: str = ""
) -> NewKey:
    """A fresh random key and its entry; ValueError (from the entry's validation) names a bad
    workspace, role or model list."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    entry = ApiKeyConfig(
        id=f"key_{secrets.token_hex(6)}",
        sha256=hash_key(key),
        workspace=workspace,
        role=role,
        name=name,
        models=models,
    )
    return NewKey(key=key, entry=entry)


def parse_models(text: str | None) -> list[str] | None:
    """`m1,m2` -> ["m1", "m2"]; None when not given. An empty list is refused: a key that may
    use no model is a mistake."""
    if text is None:
        return None
    models = [m.strip() for m in text.split(",") if m.strip()]
    if not models:
        raise ValueError("--models names no model")
    return models
