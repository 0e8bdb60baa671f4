"""Keys, per-key model lists and workspace limits: `backfill keys create`, the config entries it
prints, and the identity the api derives from them."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from pydantic import ValidationError

from api.deps import Identity
from backfill.platform.config import Settings, WorkspaceLimits, load_settings
from backfill.tenancy.keys import create_key, parse_models
from tools.cli import main

REPO = Path(__file__).resolve().parents[2]


def test_created_key_entry_loads_and_matches_only_its_key() -> None:
    new = create_key("alice", "member", ["demo", "other"], name="Alice")
    assert new.key.startswith("sk-backfill-") and len(new.key) > 40
    table = tomllib.loads(new.toml())
    assert new.key not in new.toml()
    settings = Settings(api_keys=table["api_keys"])
    key = settings.key_for(new.key)
    assert key is not None
    assert (key.workspace, key.role, key.name, key.models) == (
        "alice",
        "member",
        "Alice",
        ["demo", "other"],
    )
    assert key.key_id == new.entry.id and key.key_id.startswith("key_")
    assert settings.key_for(new.key + "x") is None


def test_two_created_keys_differ() -> None:
    a, b = create_key("w", "auditor"), create_key("w", "auditor")
    assert a.key != b.key and a.entry.key_id != b.entry.key_id
    assert "models" not in tomllib.loads(a.toml())["api_keys"][0]


def test_bad_workspace_or_role_is_refused() -> None:
    with pytest.raises(ValidationError, match="workspace"):
        create_key("not a name", "member")
    with pytest.raises(ValidationError, match="role"):
        create_key("w", "owner")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no model"):
        parse_models(" , ")
    assert parse_models("a, b") == ["a", "b"] and parse_models(None) is None


def test_cli_prints_key_once_and_entry(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["keys", "create", "--workspace", "bob", "--role", "member", "--models", "demo"]) == 0
    )
    out = capsys.readouterr().out
    key = next(w for w in out.split() if w.startswith("sk-backfill-"))
    assert out.count(key) == 1
    entry = tomllib.loads(out[out.rindex("[[api_keys]]") :])["api_keys"][0]
    settings = Settings(api_keys=[entry])
    found = settings.key_for(key)
    assert found is not None and found.models == ["demo"] and found.workspace == "bob"


def test_cli_refuses_bad_workspace(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["keys", "create", "--workspace", "a b", "--role", "member"]) == 2
    assert "workspace" in capsys.readouterr().err


def test_duplicate_key_ids_fail() -> None:
    entry = create_key("w", "member").entry.model_dump()
    other = create_key("v", "member").entry.model_dump() | {"id": entry["id"]}
    with pytest.raises(ValidationError, match="duplicate key id"):
        Settings(api_keys=[entry, other])


def test_workspace_limits_fall_back_to_default() -> None:
    s = Settings(
        workspaces={
            "default": {"max_active_batches": 5, "share_weight": 2},
            "big": {"max_stored_bytes": 10, "share_weight": 3},
        }
    )
    assert s.workspace_limits("big") == WorkspaceLimits(max_stored_bytes=10, share_weight=3)
    assert s.workspace_limits("other").max_active_batches == 5
    assert Settings().workspace_limits("x") == WorkspaceLimits()


def test_dev_config_has_tenancy_keys() -> None:
    s = load_settings(REPO / "backfill.toml")
    expected = {
        "sk-backfill-alice": ("alice", "member", None),
        "sk-backfill-bob": ("bob", "member", ["demo"]),
        "sk-backfill-auditor": ("audit", "auditor", None),
    }
    for key, want in expected.items():
        found = s.key_for(key)
        assert found is not None, key
        assert (found.workspace, found.role, found.models) == want


def test_identity_model_list() -> None:
    everyone = Identity(workspace="w", role="member", key_name="k")
    limited = Identity(
        workspace="w", role="member", key_name="k", allowed_models=frozenset({"demo"})
    )
    assert everyone.can_use("anything")
    assert limited.can_use("demo") and not limited.can_use("other")


def test_every_dev_key_counts_as_shipped() -> None:
    s = load_settings(REPO / "backfill.toml")
    assert sorted(s.shipped_dev_keys()) == ["alice", "auditor", "bob", "dev"]


def test_audit_event_only_for_another_workspace(caplog: pytest.LogCaptureFixture) -> None:
    from api.platform_admin import audit

    admin = Identity(workspace="ops", role="platform_admin", key_name="ops", key_id="key_ops")
    with caplog.at_level("INFO", logger="backfill.audit"):
        audit.cross_workspace(admin, "file.content", "file-1", "ops")
        assert caplog.records == []
        audit.cross_workspace(admin, "file.content", "file-2", "alice")
    [record] = caplog.records
    assert record.name == "backfill.audit"
    text = record.getMessage()
    for part in (
        "key_id=key_ops",
        "action=file.content",
        "object=file-2",
        "workspace=alice",
        "at=",
    ):
        assert part in text


def test_auditor_gets_no_content_and_writes_nothing() -> None:
    from api.errors import Forbidden

    auditor = Identity(workspace="audit", role="auditor", key_name="a")
    assert auditor.can_see("anyone")
    with pytest.raises(Forbidden) as content:
        auditor.require_content()
    assert content.value.code == "insufficient_role"
    with pytest.raises(Forbidden):
        auditor.require_write()
    member = Identity(workspace="w", role="member", key_name="m")
    member.require_content()
    assert not member.can_see("other")


def test_every_workspace_has_limits_by_default() -> None:
    """No workspace is unlimited unless the config says so: 100 batches, a million queued
    lines and 50 GiB stored, each overridable per workspace."""
    limits = Settings().workspace_limits("anyone")
    assert limits.max_active_batches == 100
    assert limits.max_queued_lines == 1_000_000
    assert limits.max_stored_bytes == 50 * 1024**3
    s = Settings(workspaces={"big": {"max_active_batches": 1000}})
    assert s.workspace_limits("big").max_active_batches == 1000
    assert s.workspace_limits("big").max_stored_bytes == 50 * 1024**3
