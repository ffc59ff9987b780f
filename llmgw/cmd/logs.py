"""How every component logs: `--log-level` and `--log-format text|json`, the same on each command.

json: one object per line with `time` (UTC, ISO 8601), `level`, `logger`, `message`, the
`exception` when there is one, and whatever a line about a request adds (`trace_id`, the
W3C trace id the gateway sends its engine), so a log shipper needs no parsing rules.
"""
from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from typing import TypeVar

import click

TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LEVELS = ("debug", "info", "warning", "error")
# Fields a log call may add with extra={...}; json lines carry them.
EXTRA_FIELDS = ("trace_id", "model", "replica", "node", "shard")

F = TypeVar("F", bound=Callable[..., object])


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(), "logger": record.name, "message": record.getMessage()}
        for field in EXTRA_FIELDS:
            value = getattr(record, field, None)
            if value is not None:
                line[field] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line)


def setup_logging(level: str, fmt: str) -> None:
    """The root logger to stderr, in the format asked for (replaces whatever was configured)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT))
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())


def log_options(f: F) -> F:
    """--log-level and --log-format, passed to the command as log_level and log_format."""
    f = click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True,
                     help="text: a line for people; json: one object per line (time, level, logger, message, "
                          "trace_id on lines about a request).")(f)
    f = click.option("--log-level", type=click.Choice(LEVELS), default="info", show_default=True)(f)
    return f
