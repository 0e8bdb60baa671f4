"""Audit events: a platform admin touching another workspace's objects.

Logged on the `backfill.audit` logger (kept at INFO whatever BACKFILL_LOG_LEVEL says), one line
per event: who (key id and name, role), what (action and object), whose (workspace) and when
(UTC, also the log line's own time). Never the key itself.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from api.deps import Identity

log = logging.getLogger("backfill.audit")


def cross_workspace(identity: Identity, action: str, object_id: str, workspace: str) -> None:
    """Record `action` on `object_id` when it belongs to a workspace other than the caller's."""
    if workspace == identity.workspace:
        return
    log.info(
        "audit: key_id=%s key_name=%s role=%s action=%s object=%s workspace=%s at=%s",
        identity.key_id,
        identity.key_name,
        identity.role,
        action,
        object_id,
        workspace,
        datetime.now(UTC).isoformat(timespec="seconds"),
        extra={
            "audit": {
                "key_id": identity.key_id,
                "role": identity.role,
                "action": action,
                "object": object_id,
                "workspace": workspace,
            }
        },
    )
