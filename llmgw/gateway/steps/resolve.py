"""The model a request names (a name or an alias), if its caller may call it: else a 404 that
lists only the models the caller may see. Right after a start, an unknown name waits for the
routing table's first full view (bounded by the queue's timeout; then a 503)."""
from __future__ import annotations

from collections.abc import Callable

from llmgw.gateway import errors
from llmgw.gateway.queue import WaitQueues
from llmgw.gateway.response import Response
from llmgw.gateway.scope import Scope
from llmgw.gateway.step import LATER, Call, Later, Step
from llmgw.gateway.table import RoutingTable


class Resolve(Step):
    def __init__(self, table: RoutingTable, scope: Scope, queue: WaitQueues, synced: Callable[[], bool],
                 retry_after: int) -> None:
        self.table, self.scope, self.queue, self.synced, self.retry_after = table, scope, queue, synced, retry_after

    def now(self, call: Call) -> Response | Later | None:
        model = self.table.resolve(call.name)
        if model is None and not self.synced():   # just started: the table may not know it yet
            return LATER
        return self._found(call, model)

    async def run(self, call: Call) -> Response | None:
        model = self.table.resolve(call.name)
        if model is None and not self.synced():
            if not await self.queue.synced():
                return errors.syncing(self.retry_after)
            model = self.table.resolve(call.name)
        return self._found(call, model)

    def _found(self, call: Call, model: str | None) -> Response | None:
        if model is None or not self.scope.allows(call.key, model):
            return errors.model_not_found(call.name, self.scope.known(call.key))
        call.model = model
        return None
