"""The audit options of the commands that write state (server, controller-manager): where the
audit lines go (a file, a webhook) and which are kept (a policy); docs/contracts.md, "Audit"."""
from __future__ import annotations

import functools
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import click

from llmgw.cmd.settings import SettingsError, read_file

if TYPE_CHECKING:
    from llmgw.server.audit import AuditLog

R = TypeVar("R")


@dataclass(frozen=True)
class AuditFlags:
    log: str = ""            # --audit-log PATH
    max_size: int = 100      # MB
    max_backups: int = 5
    webhook: str = ""        # --audit-webhook URL
    policy: str = ""         # --audit-policy FILE

    def open(self) -> "AuditLog | None":
        """The audit log the flags ask for (None: no backend); a ClickException (one line) if
        one cannot be opened or the policy is not one."""
        from llmgw.server.app import AUDIT_KINDS, VERBS
        from llmgw.server.audit import AUDIT_BUFFER, AuditLog, FileBackend, PolicyError, WebhookBackend, parse_policy

        try:
            policy = parse_policy(read_file(self.policy, "a mapping with rules: [...]"), self.policy, VERBS,
                                  AUDIT_KINDS) if self.policy else None
        except (PolicyError, SettingsError) as err:
            raise click.ClickException(f"--audit-policy {err}") from None
        if not (self.log or self.webhook):
            if policy is not None:
                raise click.ClickException("--audit-policy: no --audit-log or --audit-webhook to write to")
            return None
        if self.webhook and urllib.parse.urlsplit(self.webhook).scheme not in ("http", "https"):
            raise click.ClickException(f"--audit-webhook {self.webhook}: expected an http:// or https:// URL")
        backends: list[FileBackend | WebhookBackend] = []
        if self.log:
            try:
                backends.append(FileBackend(self.log, self.max_size << 20, self.max_backups, AUDIT_BUFFER))
            except OSError as err:
                raise click.ClickException(f"--audit-log {self.log}: {err.strerror or err}") from None
        if self.webhook:
            backends.append(WebhookBackend(self.webhook, AUDIT_BUFFER))
        return AuditLog(backends, policy)


_OPTIONS = [
    click.option("--audit-log", default="", metavar="PATH",
                 help="Write the audit lines here, one JSON line each (docs/contracts.md, \"Audit\"); empty: off."),
    click.option("--audit-log-max-size", type=click.IntRange(min=1), default=100, show_default=True,
                 help="MB an audit log file grows to before it rotates."),
    click.option("--audit-log-max-backups", type=click.IntRange(min=0), default=5, show_default=True,
                 help="Rotated audit log files kept (PATH.1 the newest)."),
    click.option("--audit-webhook", default="", metavar="URL",
                 help="Also POST the audit lines here, in batches (newline-delimited JSON); empty: off."),
    click.option("--audit-policy", default="", metavar="FILE",
                 help="YAML rules picking the audit lines written (docs/contracts.md, \"Audit\"); empty: every line."),
]


def audit_options(command: Callable[..., R]) -> Callable[..., R]:
    """Add the audit flags; the command receives them as ``audit`` (AuditFlags)."""
    @functools.wraps(command)
    def wrapper(*args: Any, audit_log: str, audit_log_max_size: int, audit_log_max_backups: int,
                audit_webhook: str, audit_policy: str, **kwargs: Any) -> R:
        return command(*args, audit=AuditFlags(audit_log, audit_log_max_size, audit_log_max_backups, audit_webhook,
                                               audit_policy), **kwargs)

    decorated: Callable[..., R] = wrapper
    for option in reversed(_OPTIONS):
        decorated = option(decorated)
    return decorated
