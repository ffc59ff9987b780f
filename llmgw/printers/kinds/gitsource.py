"""A GitSource's table (`llmgw get gitsources`: `-o wide` adds its columns before READY) and
what `describe` shows beside it: its last error."""
from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from llmgw.api import GITSOURCE_WAITING, GitSource
from llmgw.api.meta import get_condition
from llmgw.printers.kinds.printer import Beside, KindPrinter, Reader, register
from llmgw.printers.table import NONE, human_age


def _last_error(src: GitSource) -> str:
    """Why a GitSource cannot apply its commit (Stalled), or why its last try failed (Ready's reason)."""
    stalled = get_condition(src.status.conditions, "Stalled")
    if stalled is not None and stalled.status == "True":
        return f"{stalled.reason}: {stalled.message}"
    ready = get_condition(src.status.conditions, "Ready")
    if ready is not None and ready.status == "False" and ready.reason not in GITSOURCE_WAITING:
        return f"{ready.reason}: {ready.message}"
    return NONE


@register(GitSource)
class GitSourcePrinter(KindPrinter[GitSource]):
    """URL, ref, the applied commit (short), Ready and its reason (why not, at a glance); -o wide:
    path, interval and the commit last attempted."""

    headers = ["NAME", "URL", "REF", "REVISION", "READY", "REASON", "AGE"]
    wide_headers = ["PATH", "INTERVAL", "ATTEMPTED"]
    wide_at = 4

    def rows(self, objects: Sequence[GitSource], beside: Beside, now: datetime | None) -> list[list[str]]:
        rows: list[list[str]] = []
        for s in objects:
            ready = get_condition(s.status.conditions, "Ready")
            status = "Suspended" if s.spec.suspend else ready.status if ready is not None else "Unknown"
            rows.append([s.name, s.spec.url, str(s.spec.ref).replace(" ", ":"),
                         (s.status.lastAppliedRevision or NONE)[:12], status,
                         ready.reason if ready is not None and ready.reason else NONE,
                         human_age(s.metadata.creationTimestamp, now)])
        return rows

    def wide(self, s: GitSource) -> list[str]:
        return [s.spec.path or ".", s.spec.interval, (s.status.lastAttemptedRevision or NONE)[:12]]

    async def related(self, reader: Reader, obj: GitSource) -> list[str]:
        return [f"Last error:   {_last_error(obj)}"]
