"""A replica whose engine stops answering (issue 33's hung engine, and a partition between the
gateway and one engine): the response timeout ends a try that got no headers, the request goes
to another replica, and passive outlier detection leaves the sick replica out for a while."""
from __future__ import annotations

import asyncio
from typing import Self

import aiohttp
import pytest

from llmgw.gateway.outlier import Outliers
from llmgw.gateway.proxy import REPLICA_HEADER
from llmgw.gateway.table import RoutingTable
from tests.fixtures.gateway import Sim, metric, model, replica, running_gateway, scrape


class FakeEngine:
    """An engine on a loopback port whose connections `_serve` handles."""

    server: asyncio.base_events.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    @property
    def endpoint(self) -> str:
        assert self.server is not None
        return "127.0.0.1:%d" % self.server.sockets[0].getsockname()[1]


class Mute(FakeEngine):
    """An engine that accepts connections, reads requests and never answers."""

    def __init__(self) -> None:
        self.requests = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                self.requests += data.count(b"POST ")
        finally:
            writer.close()



@pytest.fixture(scope="module")
def sim():
    s = Sim.start("llama")
    yield s
    s.stop()


def table(*endpoints: str) -> RoutingTable:
    t = RoutingTable()
    t.apply("models", "ADDED", model("llama"))
    for i, ep in enumerate(endpoints):
        t.apply("replicas", "ADDED", replica(f"llama-{i}", "llama", ep, served=("llama",)))
    return t


BODY = {"model": "llama", "prompt": "hi", "max_tokens": 2}


async def test_failures_eject_a_replica_and_only_a_probe_that_connects_returns_it():
    now = [0.0]
    reachable = {"a:1": False}

    async def probe(endpoint: str) -> bool:
        return reachable[endpoint]
    o = Outliers(probe, threshold=3, base=5, most=12, clock=lambda: now[0])
    o.failed("a", "a:1")
    o.failed("a", "a:1")
    o.succeeded("a")                      # a response started: the streak ends
    o.failed("a", "a:1")
    o.failed("a", "a:1")
    assert set(o.excluded(["a", "b"])) == set()
    o.failed("a", "a:1")                  # three in a row
    assert set(o.excluded(["a", "b"])) == {"a"}
    assert set(o.excluded(["a"])) == set()        # never every replica of a model
    assert set(o.excluded(["a", "b"], also={"b"})) == {"b"}
    now[0] = 5.1                          # time up: a probe, not a request, finds out
    assert set(o.excluded(["a", "b"])) == {"a"}
    await asyncio.sleep(0)
    assert o.ejections["a"].until == 5.1 + 10 and o.ejections["a"].times == 2   # it failed: twice as long
    now[0] = 15.2
    o.excluded(["a", "b"])
    await asyncio.sleep(0)
    assert o.ejections["a"].until == 15.2 + 12                                   # at most `most`
    reachable["a:1"] = True
    now[0] = 27.3
    assert set(o.excluded(["a", "b"])) == {"a"}   # still out while the probe runs
    await asyncio.sleep(0)
    assert set(o.excluded(["a", "b"])) == set()   # the probe connected: routed again
    o.succeeded("a")
    assert o.ejections == {} and o.failures == {}


async def test_a_connect_that_timed_out_ejects_at_once():
    async def probe(endpoint: str) -> bool:
        return False
    o = Outliers(probe, threshold=3)
    o.failed("a", "a:1", at_once=True)
    assert set(o.excluded(["a", "b"])) == {"a"}


async def test_a_mute_replica_costs_a_response_timeout_then_is_left_out(sim):
    async with Mute() as mute, running_gateway(table(mute.endpoint, sim.endpoint), response_timeout=1.0) as gw:
        gw.gateway.outliers = Outliers(gw.gateway.outliers.probe, threshold=3, base=600)
        async with aiohttp.ClientSession() as s:
            answered_by = []
            for _ in range(10):
                async with s.post(gw.url + "/v1/completions", json=BODY) as r:
                    assert r.status == 200, await r.text()
                    answered_by.append(r.headers[REPLICA_HEADER])
            text = await scrape(s, gw)
    # every request answered by the sim; the mute one was tried three times, then never again
    assert answered_by == ["llama-1"] * 10
    assert mute.requests == 3
    assert metric(text, "llmgw_gateway_upstream_errors_total", replica="llama-0", reason="timeout") == 3


async def test_a_request_to_a_model_whose_only_replica_is_mute_ends_at_the_response_timeout():
    async with Mute() as mute, running_gateway(table(mute.endpoint), response_timeout=1.0) as gw:
        async with aiohttp.ClientSession() as s, s.post(gw.url + "/v1/completions", json=BODY) as r:
            body = await r.json()
    assert r.status == 502 and "no response within 1s" in body["error"]["message"], body
    assert mute.requests == 2     # the try and its retry on a fresh connection


class Trickle(FakeEngine):
    """An engine that answers a stream with `chunks` events `gap` seconds apart, then, with
    `stall`, sends nothing more and keeps the connection open (a hung engine, a cut link)."""

    def __init__(self, chunks: int, gap: float, stall: bool) -> None:
        self.chunks, self.gap, self.stall = chunks, gap, stall

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        for i in range(self.chunks):
            event = b'data: {"choices": [{"index": 0, "text": "t%d"}]}\n\n' % i
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
            await asyncio.sleep(self.gap)
        if self.stall:
            await asyncio.sleep(3600)
        event = b"data: [DONE]\n\n"
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(event), event))
        await writer.drain()
        writer.close()



async def _stream(url: str) -> list[bytes]:
    async with aiohttp.ClientSession() as s, \
            s.post(url + "/v1/completions", json={**BODY, "stream": True}) as r:
        assert r.status == 200
        return [line async for line in r.content if line.strip()]


async def test_a_stream_that_stops_mid_way_ends_at_the_idle_timeout_with_an_error_event():
    async with Trickle(2, 0.1, stall=True) as engine, \
            running_gateway(table(engine.endpoint), response_timeout=30.0, idle_timeout=1.0) as gw:
        lines = await asyncio.wait_for(_stream(gw.url), 20)
        async with aiohttp.ClientSession() as s:
            text = await scrape(s, gw)
    assert lines[:2] == [b'data: {"choices": [{"index": 0, "text": "t0"}]}\n',
                         b'data: {"choices": [{"index": 0, "text": "t1"}]}\n'], lines
    assert len(lines) == 3 and b"failed mid-response" in lines[2], lines   # and no [DONE]
    assert metric(text, "llmgw_gateway_upstream_errors_total",
                  model="llama", replica="llama-0", reason="midstream") == 1


@pytest.mark.serial   # 0.4 s of slack between its events and the idle timeout: alone
async def test_a_slow_steady_stream_is_not_cut_by_the_idle_timeout():
    """Events 0.6 s apart for 3 s under a 1 s idle timeout: each one restarts the clock."""
    async with Trickle(5, 0.6, stall=False) as engine, \
            running_gateway(table(engine.endpoint), response_timeout=30.0, idle_timeout=1.0) as gw:
        lines = await _stream(gw.url)
    assert len(lines) == 6 and lines[-1] == b"data: [DONE]\n", lines
