"""Structured logs: one JSON object a line, for machines to read (journald, Loki, jq).

What the domain logs (imports, settlements, exports, retention actions) carries
``event``, ``run_id`` and ``call_id`` (null where a line is about a whole run),
and whatever else it passes in ``extra``.
"""

from __future__ import annotations

import datetime as dt
import json
import logging

# What every LogRecord has; anything else on a record came in ``extra``.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "event": None,
            "run_id": None,
            "call_id": None,
        }
        line |= {key: value for key, value in vars(record).items() if key not in _STANDARD}
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)
