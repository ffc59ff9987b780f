"""The API server's audit log (issue 51; docs/contracts.md, "Audit"): one JSON line per request
that changes state and per refusal, as an audit policy says, to a file and to a webhook, each
written by a thread of its own so that no request waits on a disk or on a webhook.

A line says: time, requestId, user, groups, verb, kind, name, code, and the object's revision
after a change. It holds nothing of a request's or an answer's body, so no secret (an API key's,
its hash, a token, a private key) reaches it.

Each backend takes lines through a bounded buffer (`buffer` lines): a line that finds it full is
dropped, counted (`dropped`, the metric llmgw_server_audit_dropped_lines_total), and the first
drop and every 1,000th after are logged. The file (`--audit-log`) rotates by size
(`--audit-log-max-size` MB, `--audit-log-max-backups` files kept beside it); a line is written
and flushed to the operating system as soon as its writer takes it from the buffer. The webhook
(`--audit-webhook URL`) is sent what is buffered, up to BATCH lines a POST (newline-delimited
JSON); a POST that fails is tried again (TRIES in all), then its lines are dropped, counted
(`failed`) and logged. At a stop the webhook has CLOSE_WAIT seconds for what is buffered, each
batch tried once; what is left is logged as lost. A crash of the server loses at most the lines
still in the buffers, and the webhook's batch in flight; a crash of the machine also what the OS
had not yet written.

The policy (`--audit-policy FILE`, AuditPolicy) picks which lines are written: its first rule
that matches a line's user, groups, verb and kind gives its level, None (no line) or Metadata
(the line); a line no rule matches is not written, as in Kubernetes. Without a policy every
line is.
"""
from __future__ import annotations

import json
import logging
import queue
import threading
import time
import urllib.request
from collections.abc import Collection, Iterable
from logging.handlers import RotatingFileHandler
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from llmgw.api.limits import path_text
from llmgw.api.manifests import describe_validation_error
from llmgw.backoff import Backoff

log = logging.getLogger("llmgw.server")

AUDIT_BUFFER = 10000     # lines each backend buffers
BATCH = 400              # lines a webhook POST carries at most
TRIES = 3                # a webhook POST's, before its lines are dropped
WEBHOOK_TIMEOUT = 10.0   # seconds a webhook POST may take
CLOSE_WAIT = 15.0        # seconds a stopping server gives the webhook what is buffered


class PolicyError(ValueError):
    """An audit policy file that cannot be used; one line, naming the file."""


class AuditRule(BaseModel):
    """Lines whose user, group, verb and kind are among these (an empty list: any) get `level`."""
    model_config = ConfigDict(extra="forbid", strict=True)
    level: Literal["None", "Metadata"]
    users: list[str] = []
    groups: list[str] = []
    verbs: list[str] = []
    kinds: list[str] = []

    def matches(self, user: str | None, groups: Iterable[str], verb: str, kind: str) -> bool:
        return (not self.users or user in self.users) and (not self.groups or any(g in self.groups for g in groups)) \
            and (not self.verbs or verb in self.verbs) and (not self.kinds or kind in self.kinds)


class AuditPolicy(BaseModel):
    """Which lines are written: the level of the first rule that matches (none: no line)."""
    model_config = ConfigDict(extra="forbid", strict=True)
    rules: list[AuditRule]

    def logs(self, user: str | None, groups: Iterable[str], verb: str, kind: str) -> bool:
        rule = next((r for r in self.rules if r.matches(user, groups, verb, kind)), None)
        return rule is not None and rule.level != "None"


def parse_policy(doc: object, path: str, verbs: Collection[str], kinds: Collection[str]) -> AuditPolicy:
    """The policy the YAML document `doc` of the file `path` is, its verbs and kinds among those a
    line may carry; PolicyError (one line: the file, the field path, what is wrong) if it is not one."""
    try:
        policy = AuditPolicy.model_validate(doc)
    except ValidationError as err:
        raise PolicyError(f"{path}: {'; '.join(describe_validation_error(err))}") from None
    for i, rule in enumerate(policy.rules):
        for field, known in (("verbs", verbs), ("kinds", kinds)):
            for j, value in enumerate(getattr(rule, field)):
                if value not in known:
                    raise PolicyError(f"{path}: {path_text(['rules', i, field, j])}: unknown {field[:-1]} {value!r} "
                                      f"(one of {', '.join(sorted(known))})")
    return policy


class _Backend:
    """A writer thread behind a bounded buffer of lines; `_send` writes what it takes, in order."""
    name = ""

    def __init__(self, buffer: int, batch: int) -> None:
        self._lines: queue.Queue[str | None] = queue.Queue(maxsize=buffer)
        self._batch = batch
        self.dropped = 0   # lines that found the buffer full
        self._writer = threading.Thread(target=self._write, name=f"audit {self.name}", daemon=True)
        self._writer.start()

    def put(self, text: str) -> None:
        try:
            self._lines.put_nowait(text)
        except queue.Full:
            self.dropped += 1
            if self.dropped % 1000 == 1:
                log.warning("audit %s: buffer full (%d lines): %d line(s) dropped so far", self.name,
                            self._lines.maxsize, self.dropped)

    def _write(self) -> None:
        while True:
            lines: list[str] = []
            text = self._lines.get()
            while text is not None:   # up to a batch of what is buffered, without waiting for more
                lines.append(text)
                if len(lines) == self._batch:
                    break
                try:
                    text = self._lines.get_nowait()
                except queue.Empty:
                    break
            if lines:
                self._send(lines)
            if text is None:   # closed
                return

    def _send(self, lines: list[str]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Write what is buffered, then stop."""
        self._lines.put(None)
        self._writer.join()


class FileBackend(_Backend):
    name = "log"

    def __init__(self, path: str, max_bytes: int, backups: int, buffer: int) -> None:
        self._file = RotatingFileHandler(path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8")
        self._file.setFormatter(logging.Formatter("%(message)s"))
        super().__init__(buffer, batch=1)

    def _send(self, lines: list[str]) -> None:
        for text in lines:
            self._file.emit(logging.makeLogRecord({"msg": text}))

    def close(self) -> None:
        super().close()
        self._file.close()


class WebhookBackend(_Backend):
    name = "webhook"

    def __init__(self, url: str, buffer: int, retry: Backoff | None = None, close_wait: float = CLOSE_WAIT) -> None:
        self.url = url
        self.failed = 0   # lines whose POST failed TRIES times
        self._retry = retry or Backoff(0.5, 5.0)
        self._close_wait = close_wait
        self._tries = TRIES
        super().__init__(buffer, batch=BATCH)

    def _send(self, lines: list[str]) -> None:
        body = ("\n".join(lines) + "\n").encode()
        tries = self._tries
        for attempt in range(1, tries + 1):
            req = urllib.request.Request(self.url, data=body, method="POST",
                                         headers={"Content-Type": "application/x-ndjson"})
            try:
                with urllib.request.urlopen(req, timeout=WEBHOOK_TIMEOUT) as resp:
                    resp.read()
                self._retry.reset()
                return
            except OSError as err:   # urllib's URLError and HTTPError are OSErrors
                if attempt == tries:
                    self.failed += len(lines)
                    log.warning("audit webhook %s: %d line(s) dropped after %d tries: %s (%d so far)", self.url,
                                len(lines), tries, err, self.failed)
                    return
                time.sleep(self._retry.next())

    def close(self) -> None:
        """Send what is buffered, each batch tried once, for `close_wait` seconds at most (a dead
        webhook does not hold the server's stop); what is left is logged as lost."""
        self._tries = 1
        deadline = time.monotonic() + self._close_wait
        try:
            self._lines.put(None, timeout=self._close_wait)
        except queue.Full:
            pass
        self._writer.join(max(0.0, deadline - time.monotonic()))
        if self._writer.is_alive():
            log.warning("audit webhook %s: stopped with %d line(s) not sent (it did not answer within %.0f s)",
                        self.url, self._lines.qsize(), self._close_wait)


class AuditLog:
    """The policy, and the backends each line goes to."""

    def __init__(self, backends: list[FileBackend | WebhookBackend], policy: AuditPolicy | None = None) -> None:
        self.backends = backends
        self.policy = policy

    def logs(self, user: str | None, groups: Iterable[str], verb: str, kind: str) -> bool:
        """Whether the policy writes a line of this request."""
        return self.policy is None or self.policy.logs(user, groups, verb, kind)

    def offer(self, line: dict[str, Any]) -> None:
        """Record `line` if the policy keeps its user, groups, verb and kind (a line built before
        the policy is asked: the controller-manager's)."""
        if self.logs(line["user"], line["groups"], line["verb"], line["kind"]):
            self.record(line)

    def record(self, line: dict[str, Any]) -> None:
        """Queue a line to every backend; never waits (a full buffer drops it, counted and logged)."""
        text = json.dumps(line, separators=(",", ":"))
        for backend in self.backends:
            backend.put(text)

    def close(self) -> None:
        """Write what is buffered, then close the backends."""
        for backend in self.backends:
            backend.close()
