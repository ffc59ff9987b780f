"""A place in the model's wait queue (queue.py) while it has no Ready replica, is at its
concurrency limit, or others wait before it; a 503 (429) when the queue refuses it. A cheap
request (/tokenize, /detokenize: endpoints.py) takes no place: it goes on at once."""
from __future__ import annotations

from llmgw.gateway import errors
from llmgw.gateway.endpoints import UNQUEUED
from llmgw.gateway.queue import WaitQueues
from llmgw.gateway.response import Response
from llmgw.gateway.step import LATER, Call, Later, Step


class Wait(Step):
    def __init__(self, queue: WaitQueues, retry_after: int) -> None:
        self.queue, self.retry_after = queue, retry_after

    def now(self, call: Call) -> Response | Later | None:
        return LATER if self.queue.blocked(call.model) and call.request.path not in UNQUEUED else None

    async def run(self, call: Call) -> Response | None:
        if not self.queue.blocked(call.model) or call.request.path in UNQUEUED:
            return None
        request = call.request
        refused = await self.queue.wait(call.model, request.priority,
                                        lambda leave: setattr(request, "on_eof", leave))
        request.on_eof = None
        if refused is not None:
            return errors.queue_refused(call.model, refused, self.retry_after)
        return None
