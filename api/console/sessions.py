"""Console sessions: a server-side table keyed by a random id, so the cookie never holds the key.

Signing in checks the key once (`Settings.key_for`) and keeps only what it maps to (the
`Identity`: workspace, role, key id and name) with a CSRF token; the browser gets the random
session id in an HttpOnly, SameSite=Strict cookie. The table lives in the api process's memory:
signing out (or restarting the api) ends the session at once; behind several api replicas the
console needs sticky sessions (docs/console.md).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from api.deps import Identity

IDLE_SECONDS = 8 * 3600
"""A session unused this long ends."""
MAX_AGE_SECONDS = 24 * 3600
"""A session ends this long after sign-in, used or not."""
MAX_SESSIONS = 10_000
"""The table's bound against memory exhaustion: when this many are live, signing in is refused
(`SessionsFull`) rather than ending anyone's session."""
MAX_SESSIONS_PER_KEY = 20
"""Sessions of one key at once: its 21st sign-in ends that key's own oldest session."""


class SessionsFull(Exception):
    """The table holds `MAX_SESSIONS` live sessions: a new sign-in must wait for some to end."""


@dataclass
class Session:
    id: str
    """The cookie's value: 256 random bits."""
    identity: Identity
    csrf_token: str
    """Every state-changing form carries it; compared in constant time."""
    created_at: float
    last_seen: float

    def expired(self, now: float) -> bool:
        return now - self.last_seen > IDLE_SECONDS or now - self.created_at > MAX_AGE_SECONDS

    def csrf_ok(self, presented: str | None) -> bool:
        return presented is not None and secrets.compare_digest(
            presented.encode(), self.csrf_token.encode()
        )


@dataclass
class SessionTable:
    sessions: dict[str, Session] = field(default_factory=dict)
    limit: int = MAX_SESSIONS
    per_key: int = MAX_SESSIONS_PER_KEY

    def create(self, identity: Identity, now: float) -> Session:
        """A new session; the key's own oldest ones end to keep it within `per_key`. Nobody
        else's session ends: when the whole table is full, `SessionsFull`."""
        self._prune(now)
        own = sorted(
            (s for s in self.sessions.values() if _holder(s.identity) == _holder(identity)),
            key=lambda s: s.created_at,
        )
        for old in own[: max(0, len(own) - self.per_key + 1)]:
            del self.sessions[old.id]
        if len(self.sessions) >= self.limit:
            raise SessionsFull
        session = Session(
            id=secrets.token_urlsafe(32),
            identity=identity,
            csrf_token=secrets.token_urlsafe(32),
            created_at=now,
            last_seen=now,
        )
        self.sessions[session.id] = session
        return session

    def get(self, session_id: str | None, now: float) -> Session | None:
        """The live session with this id (its idle clock restarts), else None."""
        session = self.sessions.get(session_id) if session_id else None
        if session is None:
            return None
        if session.expired(now):
            del self.sessions[session.id]
            return None
        session.last_seen = now
        return session

    def drop(self, session_id: str) -> None:
        self.sessions.pop(session_id, None)

    def _prune(self, now: float) -> None:
        for s in [s for s in self.sessions.values() if s.expired(now)]:
            del self.sessions[s.id]


def _holder(identity: Identity) -> tuple[str, str]:
    """Whose session it is: the key (by id; by workspace and name for keys without one)."""
    return (identity.key_id, "") if identity.key_id else (identity.workspace, identity.key_name)
