"""The endpoint the request calls must be one its model's engine serves (else a 404 naming both);
a Responses API request that continues a stored response (`previous_response_id`) is pinned to
the replica its id names (responses.py), with the engine's own id put back in the body, or, when
that replica has left routing, answered with the engine's own 404 for an unknown response,
saying so."""
from __future__ import annotations

from llmgw.gateway import errors
from llmgw.gateway.endpoints import EVERYWHERE, RESPONSES, serves
from llmgw.gateway.response import Response
from llmgw.gateway.responses import home
from llmgw.gateway.step import Call, Step
from llmgw.gateway.table import RoutingTable


class Endpoint(Step):
    def __init__(self, table: RoutingTable) -> None:
        self.table = table

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
        found = home(previous) if isinstance(previous, str) else None
        if found is None:
            return None   # not an id the gateway handed out: the policy picks
        engine_id, replica = found
        b = self.table.backends.get(replica)
        if b is None or b.model != call.model:
            return errors.response_gone(str(previous), replica)
        call.body.update(previous_response_id=engine_id)
        call.pinned = replica
        return None
