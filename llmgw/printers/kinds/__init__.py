"""Each kind's printer, one module each (kubectl's printer handlers), registered by kind class
in llmgw.printers.kinds.printer: a new kind's table is a module beside them, imported here
(docs/architecture.md, "Adding a kind's table")."""
from __future__ import annotations

from llmgw.printers.kinds import (  # noqa: F401 - they register
    adapter,
    apikey,
    gitsource,
    model,
    node,
    replica,
    role,
    rolebinding,
    shard,
)
from llmgw.printers.kinds.printer import PRINTERS, Beside, KindPrinter, Reader, Table, by_name, printer_of, table

__all__ = ["PRINTERS", "Beside", "KindPrinter", "Reader", "Table", "by_name", "printer_of", "table"]
