"""Each model's wait queue (llmgw/gateway/queue.py): alone, then in a real gateway with sim engines.

Alone: order, priority classes, shedding, the bound, the timeout and a caller that leaves.
In a gateway on a real socket: a model known at zero holds requests until its replica is
routable, then answers them all; a full queue and a timeout answer 503 with Retry-After; the
concurrency limit answers 429; an unknown model still 404s; a gateway not yet synced holds the
request for its first view rather than 404 it.
"""
from __future__ import annotations

import asyncio

import aiohttp
import pytest

from llmgw.gateway.gateway import QueueSettings
from llmgw.gateway.queue import UNLIMITED, Refusal, WaitQueues, Why
from llmgw.gateway.table import RoutingTable
from tests.fixtures.gateway import Sim, model, replica, running_gateway
from tests.fixtures.poll import until


class Room:
    """What the gateway would say: None (no replica) or how many more may go."""

    def __init__(self) -> None:
        self.value: int | None = None

    def __call__(self, model: str) -> int | None:
        return self.value


async def started(queues: WaitQueues, model: str, n: int, priority: str = "standard") -> list[asyncio.Task]:
    """n waiters, each in the queue before the next arrives (so their arrival order is known)."""
    tasks = []
    for _ in range(n):
        before = queues.waiting().get(model, 0)
        tasks.append(asyncio.create_task(queues.wait(model, priority)))
        await until(lambda b=before: queues.waiting().get(model, 0) == b + 1, "the waiter queued")
    return tasks


async def test_waiters_go_in_priority_then_arrival_order_as_room_appears():
    room = Room()
    queues = WaitQueues(room, size=10, timeout=60)
    order: list[str] = []

    async def wait(tag: str, priority: str) -> None:
        assert await queues.wait("m", priority) is None
        order.append(tag)

    tasks = []
    for tag, priority in [("s1", "sheddable"), ("a1", "standard"), ("c1", "critical"), ("a2", "standard"),
                          ("c2", "critical"), ("s2", "sheddable")]:
        n = queues.waiting().get("m", 0)
        tasks.append(asyncio.create_task(wait(tag, priority)))
        await until(lambda n=n: queues.waiting().get("m", 0) == n + 1, f"{tag} queued")
    assert queues.blocked("m")
    room.value = 2                         # a replica with room for two
    queues.wake("m")
    await until(lambda: len(order) == 2, "two let go")
    assert order == ["c1", "c2"] and queues.waiting() == {"m": 4}
    room.value = UNLIMITED
    queues.wake("m")
    await asyncio.gather(*tasks)
    assert order == ["c1", "c2", "a1", "a2", "s1", "s2"]
    assert queues.waiting() == {} and not queues.blocked("m")


async def test_a_full_queue_refuses_a_request_with_no_worse_class_waiting():
    room = Room()
    queues = WaitQueues(room, size=2, timeout=60)
    waiters = await started(queues, "m", 2, "critical")
    refused = await queues.wait("m", "sheddable")
    assert refused is not None and (refused.why, refused.limited) == (Why.FULL, False)
    refused = await queues.wait("m", "critical")
    assert refused is not None and refused.why is Why.FULL
    assert queues.waiting() == {"m": 2}
    room.value = 1                                               # a replica at its limit: 429 from now on
    queues.wake("m")
    assert await waiters[0] is None
    room.value = 0                                               # ...which it is now at
    await started(queues, "m", 1, "critical")                    # full again
    refused = await queues.wait("m", "standard")
    assert refused is not None and (refused.why, refused.limited) == (Why.FULL, True)


async def test_a_better_class_takes_the_place_of_the_latest_sheddable():
    room = Room()
    queues = WaitQueues(room, size=2, timeout=60)
    s1, s2 = await started(queues, "m", 2, "sheddable")
    critical = asyncio.create_task(queues.wait("m", "critical"))
    shed = await s2                                              # the latest sheddable goes
    assert isinstance(shed, Refusal) and shed.why is Why.SHED and not shed.limited
    assert queues.waiting() == {"m": 2} and not s1.done()
    room.value = 1
    queues.wake("m")
    assert await critical is None                                # critical first, though it came last
    assert not s1.done()
    room.value = UNLIMITED
    queues.wake("m")
    assert await s1 is None


async def test_a_waiter_times_out_and_one_that_leaves_frees_its_place():
    room = Room()
    queues = WaitQueues(room, size=1, timeout=0.2)
    refused = await queues.wait("m")
    assert refused is not None and refused.why is Why.TIMEOUT and refused.waited >= 0.2
    assert queues.waiting() == {}
    queues.timeout = 60
    (t,) = await started(queues, "m", 1)
    t.cancel()                                                   # the client went away
    await asyncio.gather(t, return_exceptions=True)
    assert queues.waiting() == {}
    (t,) = await started(queues, "m", 1)                         # its place is free again
    room.value = 1
    queues.wake("m")
    assert await t is None


async def test_room_given_to_a_waiter_that_leaves_before_it_runs_goes_to_the_next():
    room = Room()
    queues = WaitQueues(room, size=5, timeout=60)
    first, second = await started(queues, "m", 2)
    room.value = 1
    queues.wake("m")                      # first is let go...
    first.cancel()                        # ...and cancelled before its task ran
    await asyncio.gather(first, return_exceptions=True)
    assert await second is None


# ------------------------------------------------------------ in a real gateway

async def post(session: aiohttp.ClientSession, url: str, name: str) -> tuple[int, dict, str]:
    body = {"model": name, "prompt": "hi", "max_tokens": 2}
    async with session.post(url + "/v1/completions", json=body) as r:
        return r.status, dict(r.headers), await r.text()


@pytest.mark.timeout(60)
async def test_requests_for_a_model_at_zero_wait_for_its_replica_and_an_unknown_model_404s():
    table = RoutingTable()
    table.apply("models", "ADDED", model("cold"))
    sim = None
    try:
        async with running_gateway(table) as gw, aiohttp.ClientSession() as session:
            status, _, text = await post(session, gw.url, "nosuch")
            assert status == 404 and "model_not_found" in text
            asks = [asyncio.create_task(post(session, gw.url, "cold")) for _ in range(20)]
            await until(lambda: gw.gateway.queue.waiting() == {"cold": 20}, "20 waiting")
            sim = Sim.start("cold")
            table.apply("replicas", "ADDED", replica("cold-r1", "cold", sim.endpoint))
            answers = await asyncio.gather(*asks)
            assert [a[0] for a in answers] == [200] * 20
            assert gw.gateway.queue.waiting() == {}
    finally:
        if sim:
            sim.stop()


@pytest.mark.timeout(60)
async def test_a_full_queue_and_a_timeout_answer_503_with_retry_after():
    table = RoutingTable()
    table.apply("models", "ADDED", model("cold"))
    async with running_gateway(table, retry_after=3, queue=QueueSettings(size=2, timeout=1.0)) as gw, \
            aiohttp.ClientSession() as session:
        asks = [asyncio.create_task(post(session, gw.url, "cold")) for _ in range(2)]
        await until(lambda: gw.gateway.queue.waiting() == {"cold": 2}, "2 waiting")
        status, headers, text = await post(session, gw.url, "cold")
        assert (status, headers["Retry-After"]) == (503, "3") and '"code": "model_queue_full"' in text
        for status, headers, text in await asyncio.gather(*asks):
            assert (status, headers["Retry-After"]) == (503, "3") and '"code": "model_queue_timeout"' in text
            assert '"type": "service_unavailable"' in text


@pytest.mark.timeout(60)
async def test_past_the_concurrency_limit_requests_wait_in_order_then_429():
    sim = Sim.start("busy", extra=["--ttft-ms", "300"])
    table = RoutingTable()
    table.apply("models", "ADDED", model("busy"))
    table.apply("replicas", "ADDED", replica("busy-r1", "busy", sim.endpoint))
    try:
        async with running_gateway(table, queue=QueueSettings(size=3, timeout=30, model_concurrency=1)) as gw, \
                aiohttp.ClientSession() as session:
            done: list[int] = []

            async def ask(i: int) -> int:
                status, _, _ = await post(session, gw.url, "busy")
                done.append(i)
                return status

            asks = [asyncio.create_task(ask(0))]
            await until(lambda: gw.gateway.balancer.per_model.get("busy") == 1, "one in flight")
            for i in range(1, 4):
                asks.append(asyncio.create_task(ask(i)))
                await until(lambda i=i: gw.gateway.queue.waiting().get("busy") == i, f"{i} waiting")
            status, headers, text = await post(session, gw.url, "busy")
            assert (status, "Retry-After" in headers) == (429, True) and '"code": "model_queue_full"' in text
            assert await asyncio.gather(*asks) == [200] * 4
            assert done == [0, 1, 2, 3]                          # one at a time, in arrival order
    finally:
        sim.stop()


@pytest.mark.timeout(60)
async def test_before_its_first_sync_the_gateway_holds_a_request_rather_than_404_it():
    table = RoutingTable()
    sim = Sim.start("late")
    try:
        async with running_gateway(table, synced=False, queue=QueueSettings(timeout=0.5)) as gw, \
                aiohttp.ClientSession() as session:
            status, headers, text = await post(session, gw.url, "late")   # held, then refused: retryable
            assert (status, "Retry-After" in headers) == (503, True) and '"code": "gateway_syncing"' in text
            gw.gateway.queue.timeout = 30
            ask = asyncio.create_task(post(session, gw.url, "late"))
            table.apply("models", "ADDED", model("late"))
            table.apply("replicas", "ADDED", replica("late-r1", "late", sim.endpoint))
            gw.gateway.synced = True
            status, _, _ = await ask
            assert status == 200
            status, _, _ = await post(session, gw.url, "nosuch")
            assert status == 404
    finally:
        sim.stop()


@pytest.mark.timeout(60)
async def test_a_client_that_hangs_up_while_waiting_leaves_the_queue():
    table = RoutingTable()
    table.apply("models", "ADDED", model("cold"))
    async with running_gateway(table) as gw:
        port = int(gw.url.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        body = b'{"model": "cold", "prompt": "hi"}'
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        await until(lambda: gw.gateway.queue.waiting() == {"cold": 1}, "it waits")
        writer.write_eof()                                   # the client hangs up (its FIN)
        answer = await reader.read()
        assert answer.startswith(b"HTTP/1.1 499 ") and b"client_closed_request" in answer
        assert gw.gateway.queue.waiting() == {}
        writer.close()
