"""The API server's audit log (issue 51; docs/contracts.md, "Audit"): one JSON line per request
that changes state and per refusal, written by a thread of its own so that no request waits on
the disk.

A line says: time, requestId, user, groups, verb, kind, name, code, and the object's revision
after a change. It holds nothing of a request's or an answer's body, so no secret (an API key's,
its hash, a token, a private key) reaches it. Lines go through a bounded buffer to a file that
rotates by size (`--audit-log-max-size` MB, `--audit-log-max-backups` files kept beside it); a
line that finds the buffer full is dropped, counted (`dropped`), and the first drop and every
1,000th after are logged. A line is written and flushed to the operating system as soon as the
writer takes it from the buffer; a crash of the server loses at most the lines still in the
buffer (up to `buffer` lines), a crash of the machine what the OS had not yet written.
"""
from __future__ import annotations

import json
import logging
import queue
import threading
from logging.handlers import RotatingFileHandler
from typing import Any

log = logging.getLogger("llmgw.server")

_STOP = None


class AuditLog:
    def __init__(self, path: str, max_bytes: int = 100 << 20, backups: int = 5, buffer: int = 10000) -> None:
        self._file = RotatingFileHandler(path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8")
        self._file.setFormatter(logging.Formatter("%(message)s"))
        self._lines: queue.Queue[str | None] = queue.Queue(maxsize=buffer)
        self.dropped = 0
        self._writer = threading.Thread(target=self._write, name="audit log", daemon=True)
        self._writer.start()

    def record(self, line: dict[str, Any]) -> None:
        """Queue a line; never waits (a full buffer drops it, counted and logged)."""
        try:
            self._lines.put_nowait(json.dumps(line, separators=(",", ":")))
        except queue.Full:
            self.dropped += 1
            if self.dropped % 1000 == 1:
                log.warning("audit log: buffer full (%d lines): %d line(s) dropped so far", self._lines.maxsize,
                            self.dropped)

    def _write(self) -> None:
        while (text := self._lines.get()) is not _STOP:
            self._file.emit(logging.makeLogRecord({"msg": text}))

    def close(self) -> None:
        """Write what is buffered, then close the file."""
        self._lines.put(_STOP)
        self._writer.join()
        self._file.close()
