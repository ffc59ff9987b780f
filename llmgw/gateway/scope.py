"""Which models a caller may see: every model without keys; with watched keys, those its
ApiKey's scope allows (admission.py). A caller learns of no other model, in a 404 or a list."""
from __future__ import annotations

from llmgw.api import ApiKey
from llmgw.gateway.admission import Admission
from llmgw.gateway.table import RoutingTable


class Scope:
    def __init__(self, table: RoutingTable, admission: Admission | None) -> None:
        self.table, self.admission = table, admission

    def allows(self, key: ApiKey | None, model: str) -> bool:
        return key is None or self.admission is None or self.admission.allows(key, model)

    def known(self, key: ApiKey | None) -> list[str]:
        """The model names a 404 lists: those the key may call."""
        names = self.table.known_names()
        if key is None:
            return names
        return [n for n in names if self.allows(key, self.table.resolve(n) or n)]
