"""The node's log lines: text for people, or JSON (--log-format json) for log
collectors, one object per line."""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (ISO 8601, UTC), level, logger, message and
    node_id, plus the traceback of a logged exception."""

    def __init__(self, node_id: str) -> None:
        super().__init__()
        self.node_id = node_id

    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": datetime.fromtimestamp(record.created, timezone.utc)
                 .isoformat(timespec="milliseconds"),
                 "level": record.levelname, "logger": record.name,
                 "message": record.getMessage(), "node_id": self.node_id}
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(node_id: str, level: str, log_format: str = "text") -> None:
    handler = logging.StreamHandler()
    if log_format == "json":
        handler.setFormatter(JsonFormatter(node_id))
    else:
        handler.setFormatter(logging.Formatter(
            f"%(asctime)s {node_id} %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler])
