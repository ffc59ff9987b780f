"""A toy gateway step, written as a new one is (docs/architecture.md, "Adding a gateway step"):
one module with one `Step`. tests/test_gateway_step_toy.py puts it in a running gateway's chain.

tea-time: a request with `X-Toy: teapot` is answered 418 by the step itself (the chain stops
there: no engine sees it); with `X-Toy-Max-Tokens: N` it goes on with its body's max_tokens set
to N; with `X-Toy: later` the step waits (a task's turn of the loop) before it lets it go on;
any other request goes on untouched.
"""
from __future__ import annotations

import asyncio

from llmgw.gateway.response import Response, json_response
from llmgw.gateway.step import LATER, Call, Later, Step


class TeaTime(Step):
    def __init__(self) -> None:
        self.now_calls = 0   # decided without waiting (the fast path, from protocol callbacks)
        self.run_calls = 0   # in a task

    def now(self, call: Call) -> Response | Later | None:
        self.now_calls += 1
        toy = call.request.header(b"x-toy")
        if toy == b"teapot":
            return json_response({"error": {"message": f"{call.model} is a teapot", "type": "toy"}}, status=418)
        if toy == b"later":
            return LATER
        return _enrich(call)

    async def run(self, call: Call) -> Response | None:
        self.run_calls += 1
        await asyncio.sleep(0)
        return _enrich(call)


def _enrich(call: Call) -> None:
    tokens = call.request.header(b"x-toy-max-tokens")
    if tokens is not None:
        call.body.update(max_tokens=int(tokens))
