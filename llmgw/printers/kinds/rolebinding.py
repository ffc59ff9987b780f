"""A RoleBinding's table (`llmgw get rolebindings`) and what `describe` shows beside it: each subject."""
from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from llmgw.api import RoleBinding
from llmgw.printers.kinds.printer import Beside, KindPrinter, Reader, register
from llmgw.printers.table import human_age, join


@register(RoleBinding)
class RoleBindingPrinter(KindPrinter[RoleBinding]):
    headers = ["NAME", "ROLE", "USERS", "GROUPS", "AGE"]

    def rows(self, objects: Sequence[RoleBinding], beside: Beside, now: datetime | None) -> list[list[str]]:
        return [[b.name, b.spec.roleRef.name, join([s.name for s in b.spec.subjects if s.kind == "User"]),
                 join([s.name for s in b.spec.subjects if s.kind == "Group"]),
                 human_age(b.metadata.creationTimestamp, now)] for b in objects]

    async def related(self, reader: Reader, obj: RoleBinding) -> list[str]:
        return [f"subject: {s}" for s in obj.spec.subjects]
