"""W3C Trace Context through the gateway: every request reaches its engine with a traceparent.

A client's trace is continued (same trace id, the gateway's own span as parent); a request
without one starts a trace. The sim engine joins it and answers a `traceresponse` of the
same trace id, which the gateway passes back: one trace id from the client to the engine.
"""
from __future__ import annotations

import json

import aiohttp
import pytest

from llmgw.gateway.trace import trace_id, traceparent
from tests.fixtures.gateway import running_gateway
from tests.gateway.test_gateway_server import sim, table_for  # noqa: F401 - the module's sim engine fixture

CLIENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


async def ask(url: str, headers: dict[str, str], stream: bool = False) -> str:
    body = {"model": "llama", "prompt": "hi", "max_tokens": 2, "stream": stream}
    async with aiohttp.ClientSession() as s, s.post(url + "/v1/completions", data=json.dumps(body),
                                                     headers={"content-type": "application/json", **headers}) as r:
        assert r.status == 200
        await r.read()
        return r.headers["traceresponse"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_clients_trace_reaches_the_engine_and_a_new_one_is_started_without(sim, stream):
    async with running_gateway(table_for(sim.endpoint)) as gw:
        answered = await ask(gw.url, {"traceparent": CLIENT}, stream)
        assert trace_id(answered) == trace_id(CLIENT)            # the client's trace, continued
        assert answered.split("-")[2] != CLIENT.split("-")[2]      # under a span of the engine's
        first, second = await ask(gw.url, {}, stream), await ask(gw.url, {"traceparent": "garbage"}, stream)
        assert trace_id(first) and trace_id(second) and trace_id(first) != trace_id(second)  # started


def test_traceparent_continues_a_valid_trace_and_starts_one_for_anything_else():
    continued = traceparent(CLIENT.encode())
    assert continued.startswith(b"00-4bf92f3577b34da6a3ce929d0e0e4736-") and continued.endswith(b"-01")
    assert continued.split(b"-")[2] != b"00f067aa0ba902b7"
    for bad in (None, b"", b"00-" + b"0" * 32 + b"-00f067aa0ba902b7-01", b"01-xyz", b"00-4bf9-00f0-01"):
        fresh = traceparent(bad)
        assert trace_id(fresh) not in (None, "0" * 32) and fresh.endswith(b"-01")
