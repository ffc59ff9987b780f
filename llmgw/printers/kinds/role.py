"""A Role's table (`llmgw get roles`: the built-in ones beside those stored) and what `describe`
shows beside it: each of its rules, one a line."""
from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from llmgw.api import Role
from llmgw.api.wellknown import BUILTIN_ROLE_LABEL
from llmgw.printers.kinds.printer import Beside, KindPrinter, Reader, register
from llmgw.printers.table import human_age


@register(Role)
class RolePrinter(KindPrinter[Role]):
    headers = ["NAME", "BUILTIN", "RULES", "AGE"]

    def rows(self, objects: Sequence[Role], beside: Beside, now: datetime | None) -> list[list[str]]:
        return [[r.name, "yes" if r.metadata.labels.get(BUILTIN_ROLE_LABEL) == "true" else "no",
                 str(len(r.spec.rules)), human_age(r.metadata.creationTimestamp, now)] for r in objects]

    async def related(self, reader: Reader, obj: Role) -> list[str]:
        return [f"rule: {rule}" for rule in obj.spec.rules]
