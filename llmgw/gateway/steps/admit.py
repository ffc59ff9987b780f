"""A watched key's limits (admission.py): its ticket, its priority class for the model's queue,
and a stream's usage asked for when tokens are limited; a 429 past a limit."""
from __future__ import annotations

from llmgw.gateway.admission import Admission, Ticket
from llmgw.gateway.response import Response
from llmgw.gateway.step import Call, Later, Step


class Admit(Step):
    def __init__(self, admission: Admission) -> None:
        self.admission = admission

    def now(self, call: Call) -> Response | Later | None:
        key = call.key
        if key is None:   # no ApiKey object: nothing to limit
            return None
        ticket = self.admission.admit(key, call.model, call.request.abort)
        if not isinstance(ticket, Ticket):
            self.admission.refused(key.name, call.model)
            return ticket
        request = call.request
        request.ticket = ticket   # released once the request is answered (proxy.py: Proxy.finished)
        request.priority = key.spec.priorityClass   # the model's wait queue orders by it (queue.py)
        if key.spec.limits.tokensPerMinute is not None:
            call.body.ask_usage()
        return None
