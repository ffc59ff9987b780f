"""A step of the gateway's request chain (chain.py), and the call it works on.

As in Envoy's HTTP filter chain, each step looks at a call in turn and either answers it
(a `Response`: the chain stops there and the caller gets it) or enriches it (its key, its
body, its model) and lets it go on; past the last step the call is forwarded (proxy.py).
A step first decides without waiting (`now`), from the server's protocol callbacks: the
common request runs the whole chain so, without a task (`Gateway.begin`). A step that must
wait (for a key's KDF, a body still arriving, a place in a queue) says `LATER`, and the
chain goes on from that step in a task, where `run` may await.
"""
from __future__ import annotations

import enum
import time
from typing import Final

from llmgw.api import ApiKey
from llmgw.gateway.body import Body
from llmgw.gateway.http1 import Request
from llmgw.gateway.response import Response


class Later(enum.Enum):
    LATER = "later"


LATER: Final = Later.LATER   # `now`'s answer when the step must wait: `run` it in a task


class Call:
    """One proxied request on its way through the chain: what the steps learn of it."""

    __slots__ = ("request", "start", "key", "body", "name", "model", "pinned")

    body: Body    # its parsed body (from the parse step on)
    name: str     # the model name or alias it asks for (from the parse step on)

    def __init__(self, request: Request) -> None:
        self.request = request
        self.start = time.perf_counter()
        self.key: ApiKey | None = None   # its caller's ApiKey object (none without watched keys)
        self.model = ""   # the model it is routed to, once resolved (and the caller may call it)
        self.pinned: str | None = None   # the one replica it may go to (the one holding its previous response)


class Step:
    """One step of the chain: `now` decides without waiting; `run` is the step where it may."""

    def now(self, call: Call) -> Response | Later | None:
        """An answer (the chain stops), None (the call goes on), or LATER (this step must wait)."""
        raise NotImplementedError

    async def run(self, call: Call) -> Response | None:
        """In a task: an answer, or None. A step that never says LATER keeps this one."""
        answer = self.now(call)
        if answer is LATER:
            raise NotImplementedError(f"{type(self).__name__} said LATER: it must define run")
        return answer
