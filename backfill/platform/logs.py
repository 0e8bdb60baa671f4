"""JSON log lines (`BACKFILL_LOG_FORMAT=json`): one object per line, for log collectors.

Fields: `time` (ISO 8601, UTC), `level`, `logger`, `message`, `exception` (when there is one),
and, when a log call names them, the context fields in `CONTEXT_FIELDS` (batch id, route,
workspace, status, reason, ...) and the Temporal workflow's or activity's identity. Only these
named fields are copied: a log call's other `extra` values are left out, so no request body,
header or key reaches the output through them (and none is ever logged by message).
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

CONTEXT_FIELDS = ("batch_id", "route", "workspace", "status", "paused", "reason", "routes")
TEMPORAL_FIELDS = {
    "temporal_workflow": ("workflow_id", "run_id", "workflow_type", "task_queue"),
    "temporal_activity": ("activity_type", "workflow_id", "workflow_run_id", "attempt"),
}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in CONTEXT_FIELDS:
            if name in record.__dict__:
                out[name] = record.__dict__[name]
        for group, names in TEMPORAL_FIELDS.items():
            info = record.__dict__.get(group)
            if isinstance(info, dict):
                out.update({f"{group}.{n}": info[n] for n in names if n in info})
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)
