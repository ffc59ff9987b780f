"""The endpoint the request calls must be one its model's engine serves (else a 404 naming both);
a Responses API request that continues a stored response (`previous_response_id`) is pinned to
the replica that made it (responses.py), or, when that replica has left routing, answered with
the engine's own 404 for an unknown response, saying so."""
from __future__ import annotations

from llmgw.gateway import errors
from llmgw.gateway.endpoints import EVERYWHERE, RESPONSES, serves
from llmgw.gateway.response import Response
from llmgw.gateway.responses import ResponseHomes
from llmgw.gateway.step import Call, Step
from llmgw.gateway.table import RoutingTable


class Endpoint(Step):
    def __init__(self, table: RoutingTable, homes: ResponseHomes) -> None:
        self.table, self.homes = table, homes

    def now(self, call: Call) -> Response | None:
        path = call.request.path
        if path in EVERYWHERE:
            return None
        backends = self.table.backends_for(call.model)
        if backends and not any(serves(b, path) for b in backends):
            engines = sorted({b.engine or "unknown" for b in backends})
            return errors.endpoint_not_served(path.decode(), call.model, engines)
        if path != RESPONSES:
            return None
        previous = call.body.doc.get("previous_response_id")
        replica = self.homes.home(previous) if isinstance(previous, str) else None
        if replica is None:
            return None   # not made through this gateway (or forgotten): the policy picks
        b = self.table.backends.get(replica)
        if b is None or b.model != call.model:
            return errors.response_gone(str(previous), replica)
        call.pinned = replica
        return None
