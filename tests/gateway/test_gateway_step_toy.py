"""A gateway step added by writing one module (tests/fixtures/toy_gateway_step.py) and one line in the chain:
in a real gateway's chain, before sim engines, it answers and stops the chain, enriches a request
that goes on, waits in a task, and lets the rest go by."""
from __future__ import annotations

import aiohttp
import pytest

from llmgw.gateway.chain import Wiring, standard
from llmgw.gateway.proxy import REPLICA_HEADER
from llmgw.gateway.step import Step
from tests.fixtures.gateway import Sim, metric, running_gateway, scrape
from tests.fixtures.toy_gateway_step import TeaTime
from tests.gateway.test_gateway_server import table_for


@pytest.fixture(scope="module")
def sim():
    s = Sim.start("llama")
    yield s
    s.stop()


async def test_the_toy_step_answers_enriches_waits_and_lets_go_by(sim):
    toy = TeaTime()

    def chain(w: Wiring) -> list[Step]:
        return [*standard(w), toy]   # the one line: after the standard steps, before the forwarding

    async with running_gateway(table_for(sim.endpoint), steps=chain) as gw, aiohttp.ClientSession() as s:
        assert gw.gateway.steps[-1] is toy

        async def ask(headers: dict[str, str]) -> tuple[int, dict, str | None]:
            body = {"model": "llama", "prompt": "hi", "max_tokens": 1}
            async with s.post(gw.url + "/v1/completions", json=body, headers=headers) as r:
                return r.status, await r.json(), r.headers.get(REPLICA_HEADER)

        status, doc, replica = await ask({})   # let go by: the engine answers as asked
        assert status == 200 and replica == "llama-0" and doc["usage"]["completion_tokens"] == 1
        assert (toy.now_calls, toy.run_calls) == (1, 0)

        status, doc, replica = await ask({"X-Toy": "teapot"})   # answered by the step: no engine saw it
        assert status == 418 and replica is None and doc["error"]["message"] == "llama is a teapot"
        assert metric(await scrape(s, gw), "llmgw_gateway_requests_total", model="llama", code="418") == 1

        status, doc, replica = await ask({"X-Toy-Max-Tokens": "3"})   # enriched: its body rewritten
        assert status == 200 and replica == "llama-0" and doc["usage"]["completion_tokens"] == 3

        status, doc, replica = await ask({"X-Toy": "later", "X-Toy-Max-Tokens": "2"})   # on in a task
        assert status == 200 and replica == "llama-0" and doc["usage"]["completion_tokens"] == 2
        assert (toy.now_calls, toy.run_calls) == (4, 1)


async def test_a_request_the_chain_stops_before_the_toy_never_reaches_it(sim):
    toy = TeaTime()
    async with running_gateway(table_for(sim.endpoint), steps=lambda w: [*standard(w), toy]) as gw, \
            aiohttp.ClientSession() as s:
        async with s.post(gw.url + "/v1/completions", json={"model": "gpt-9", "prompt": "hi"},
                          headers={"X-Toy": "teapot"}) as r:
            assert r.status == 404   # the resolve step answered first
    assert toy.now_calls == 0 and toy.run_calls == 0
