"""The gateway's demand reports: a real gateway with a slow sim engine, its publisher reporting
through a real server (a gateway certificate) into etcd, where the autoscaler reads them."""
from __future__ import annotations

import asyncio
import socket

import aiohttp

from llmgw.client import Client
from llmgw.gateway.demand import WITHDRAW_TIMEOUT, DemandPublisher, figures
from llmgw.gateway.table import RoutingTable
from tests.fixtures.cluster import api_server, ca_dir  # noqa: F401
from tests.fixtures.gateway import Sim, model, replica, running_gateway
from tests.fixtures.poll import until


async def test_requests_in_flight_are_reported_per_model_and_drop_to_zero_when_answered(api_server, store):
    sim = Sim.start("slow", extra=["--ttft-ms", "1500"])
    table = RoutingTable()
    table.apply("models", "ADDED", model("slow"))
    table.apply("replicas", "ADDED", replica("slow-r1", "slow", sim.endpoint))
    try:
        async with running_gateway(table) as gw, api_server.client(api_server.issue_component("gateway")) as c:
            publisher = DemandPublisher(c, "gw-test", lambda: figures(gw.gateway.balancer), interval=0.05, ttl=5)
            publisher.start()

            async def demand() -> dict[str, int]:
                return {m: d.inFlight for r in await store.demand.list() for m, d in r.models.items()}

            await until(lambda: publisher.reports >= 1, "a first report")
            assert await demand() == {}
            async with aiohttp.ClientSession() as session:
                async def ask() -> int:
                    body = {"model": "slow", "prompt": "hi", "max_tokens": 1}
                    async with session.post(gw.url + "/v1/completions", json=body) as r:
                        return r.status
                asks = [asyncio.create_task(ask()) for _ in range(3)]
                await until(_eq(demand, {"slow": 3}), "3 in flight reported")
                assert await asyncio.gather(*asks) == [200, 200, 200]
            await until(_eq(demand, {}), "nothing in flight once answered")
            await publisher.stop()
            # withdrawn as it stopped, not left to expire with its lease (ttl 5)
            assert [r.gateway for r in await store.demand.list()] == []
    finally:
        sim.stop()


async def test_a_server_that_does_not_answer_holds_the_stop_for_the_bound_at_most():
    """A withdrawal the server never answers (a listener that accepts no connection) is given up
    after WITHDRAW_TIMEOUT, not the client's 30 s: a stopping gateway exits; its report expires."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        async with Client(f"https://127.0.0.1:{silent.getsockname()[1]}") as c:
            publisher = DemandPublisher(c, "gw-away", dict, interval=100, ttl=600)
            publisher.start()
            await asyncio.wait_for(publisher.stop(), WITHDRAW_TIMEOUT + 5)


def _eq(read, want):
    async def check() -> bool:
        return await read() == want
    return check


async def test_the_first_request_waiting_for_a_model_at_zero_is_reported_at_once(api_server, store):
    table = RoutingTable()
    table.apply("models", "ADDED", model("cold"))                 # known, no replica
    async with running_gateway(table) as gw, api_server.client(api_server.issue_component("gateway")) as c:
        g = gw.gateway
        # an interval no test waits out: a report before it is the poke's
        publisher = DemandPublisher(c, "gw-zero", lambda: figures(g.balancer, g.queue.waiting()),
                                    interval=100, ttl=600)
        g.queue.on_first = lambda model: publisher.poke()
        publisher.start()
        await until(lambda: publisher.reports >= 1, "a first report")

        async def waiting() -> dict[str, int]:
            return {m: d.waiting for r in await store.demand.list() for m, d in r.models.items()}

        async with aiohttp.ClientSession() as session:
            body = {"model": "cold", "prompt": "hi", "max_tokens": 1}
            ask = asyncio.create_task(session.post(gw.url + "/v1/completions", json=body))
            await until(_eq(waiting, {"cold": 1}), "the waiting request reported", timeout=30)
            ask.cancel()
            await asyncio.gather(ask, return_exceptions=True)
        await until(lambda: g.queue.waiting() == {}, "the request out of the queue once its client left")
        await publisher.stop()
