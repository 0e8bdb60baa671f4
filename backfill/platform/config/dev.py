"""The repository's public development keys and the loopback names: what `check_exposure`
and the api's default Host allow-list know of a development stack."""

from __future__ import annotations

import hashlib

DEV_KEY = "sk-backfill-dev"
"""The key in the repository's backfill.toml, printed by `make run`."""
DEV_KEYS = (DEV_KEY, "sk-backfill-alice", "sk-backfill-bob", "sk-backfill-auditor")
"""Every key of the repository's backfill.toml (all public)."""

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})
LOOPBACK_HOST_HEADERS = ("127.0.0.1", "localhost", "[::1]")
"""The loopback names as a `Host` header carries them (an IPv6 literal in brackets)."""


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()
