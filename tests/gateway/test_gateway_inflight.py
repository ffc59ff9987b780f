"""No request waits on a path that is gone (issue 45): a try still waiting for its response
headers goes to another replica once its replica leaves routing (not Ready, ejected, deleted);
a stream whose engine is known dead (the replica Failed, or deleted) ends at once with an error
event; upstream connections carry TCP keepalive. Real `llmgw sim` engines, one SIGSTOPped to
hold a try in flight as a hung or cut-off engine would."""
from __future__ import annotations

import asyncio
import signal
import socket
import time
from collections.abc import Iterator

import aiohttp
import pytest

from llmgw.gateway.proxy import REPLICA_HEADER
from llmgw.gateway.table import RoutingTable
from llmgw.gateway.upstream import Keepalive
from tests.fixtures.gateway import Sim, model, replica, running_gateway

BODY = {"model": "llama", "prompt": "hi", "max_tokens": 2}


@pytest.fixture
def sims() -> Iterator[tuple[Sim, Sim]]:
    a = Sim.start("llama", extra=["--tokens-per-second", "20"])
    b = Sim.start("llama", extra=["--tokens-per-second", "20"])
    try:
        yield a, b
    finally:
        for s in (a, b):
            s.proc.send_signal(signal.SIGCONT)
            s.stop()


def only(sim: Sim) -> RoutingTable:
    t = RoutingTable()
    t.apply("models", "ADDED", model("llama"))
    t.apply("replicas", "ADDED", replica("llama-a", "llama", sim.endpoint, served=("llama",)))
    return t


async def _post(url: str, body: dict[str, object]) -> tuple[int, str, str]:
    async with aiohttp.ClientSession() as s, s.post(url + "/v1/completions", json=body) as r:
        return r.status, r.headers.get(REPLICA_HEADER, ""), await r.text()


async def _held(url: str, sim: Sim, body: dict[str, object],
                warm: bool = False) -> tuple[asyncio.Task[tuple[int, str, str]], float]:
    """A request sent to `sim`, stopped: its task (status, replica, text) once it is in flight;
    `warm`: on a kept-alive connection (sent from the protocol callbacks, without a task),
    else on a new one (in a task)."""
    if warm:
        assert (await _post(url, body))[0] == 200
    sim.proc.send_signal(signal.SIGSTOP)
    task = asyncio.create_task(_post(url, body))
    await asyncio.sleep(0.5)
    assert not task.done()
    return task, time.monotonic()


@pytest.mark.parametrize("leaves,warm", [("not ready", False), ("not ready", True), ("deleted", False),
                                         ("ejected", False)])
async def test_a_try_without_headers_goes_to_another_replica_once_its_replica_leaves(sims, leaves, warm):
    a, b = sims
    async with running_gateway(only(a), response_timeout=600.0, idle_timeout=300.0) as gw:
        task, t0 = await _held(gw.url, a, BODY, warm)
        gw.table.apply("replicas", "ADDED", replica("llama-b", "llama", b.endpoint, served=("llama",)))
        if leaves == "not ready":
            gw.table.apply("replicas", "MODIFIED", replica("llama-a", "llama", a.endpoint, phase="Starting",
                                                           served=("llama",)))
        elif leaves == "deleted":
            gw.table.apply("replicas", "DELETED", replica("llama-a", "llama", a.endpoint, served=("llama",)))
        else:
            gw.gateway.outliers.failed("llama-a", a.endpoint, at_once=True)
        status, by, text = await asyncio.wait_for(task, 10)
        waited = time.monotonic() - t0
    assert status == 200 and by == "llama-b", text
    assert waited < 5, waited


async def test_a_try_on_a_draining_replica_is_left_to_finish(sims):
    """A replica marked for deletion leaves routing before its engine stops (make-before-break):
    what it is already doing is not sent again elsewhere."""
    a, b = sims
    async with running_gateway(only(a)) as gw:
        task, _ = await _held(gw.url, a, BODY)
        gw.table.apply("replicas", "ADDED", replica("llama-b", "llama", b.endpoint, served=("llama",)))
        gw.table.apply("replicas", "MODIFIED", replica("llama-a", "llama", a.endpoint, served=("llama",),
                                                       deleting=True))
        await asyncio.sleep(1)
        assert not task.done()
        a.proc.send_signal(signal.SIGCONT)
        status, by, text = await asyncio.wait_for(task, 10)
    assert status == 200 and by == "llama-a", text


async def test_a_try_whose_only_replica_leaves_is_not_sent_to_it_again(sims):
    a, _ = sims
    async with running_gateway(only(a)) as gw:
        task, t0 = await _held(gw.url, a, BODY)
        gw.table.apply("replicas", "MODIFIED", replica("llama-a", "llama", None, phase="Failed", served=("llama",)))
        status, _, text = await asyncio.wait_for(task, 10)
    assert status == 503 and time.monotonic() - t0 < 5, text


async def _stream_then(url: str, after_first: asyncio.Event) -> list[bytes]:
    async with aiohttp.ClientSession() as s, \
            s.post(url + "/v1/completions", json={**BODY, "max_tokens": 400, "stream": True}) as r:
        assert r.status == 200
        lines = []
        async for line in r.content:
            if line.strip():
                lines.append(line)
                after_first.set()
        return lines


@pytest.mark.parametrize("dead", ["failed", "deleted", "not ready, then failed"])
async def test_a_stream_whose_engine_is_known_dead_ends_at_once_with_an_error_event(sims, dead):
    a, _ = sims
    async with running_gateway(only(a), response_timeout=600.0, idle_timeout=300.0) as gw:
        started = asyncio.Event()
        task = asyncio.create_task(_stream_then(gw.url, started))
        await asyncio.wait_for(started.wait(), 10)
        a.proc.send_signal(signal.SIGSTOP)   # the engine hangs: no more tokens, the connection open
        await asyncio.sleep(0.3)
        t0 = time.monotonic()
        if dead == "not ready, then failed":   # out of the table already: its streams went on
            gw.table.apply("replicas", "MODIFIED", replica("llama-a", "llama", a.endpoint, phase="Starting",
                                                           served=("llama",)))
            await asyncio.sleep(0.5)
            assert not task.done()
            t0 = time.monotonic()
        if dead != "deleted":
            gw.table.apply("replicas", "MODIFIED", replica("llama-a", "llama", None, phase="Failed",
                                                           served=("llama",)))
        else:
            gw.table.apply("replicas", "DELETED", replica("llama-a", "llama", a.endpoint, served=("llama",)))
        lines = await asyncio.wait_for(task, 10)
        waited = time.monotonic() - t0
    assert b"failed mid-response" in lines[-1] and b"[DONE]" not in b"".join(lines), lines
    assert waited < 3, waited


async def test_a_stream_on_a_replica_only_not_ready_goes_on(sims):
    """Not Ready (a probe failed) is not known dead: the stream keeps its tokens."""
    a, _ = sims
    async with running_gateway(only(a)) as gw:
        started = asyncio.Event()
        task = asyncio.create_task(_stream_then(gw.url, started))
        await asyncio.wait_for(started.wait(), 10)
        gw.table.apply("replicas", "MODIFIED", replica("llama-a", "llama", a.endpoint, phase="Starting",
                                                       served=("llama",)))
        lines = await asyncio.wait_for(task, 60)
    assert lines[-1] == b"data: [DONE]\n", lines[-3:]


async def test_upstream_connections_carry_tcp_keepalive(sims):
    a, _ = sims
    async with running_gateway(only(a), keepalive=Keepalive(idle=5, interval=2, probes=3)) as gw:
        async with aiohttp.ClientSession() as s, s.post(gw.url + "/v1/completions", json=BODY) as r:
            assert r.status == 200
        conn = gw.gateway.pool.idle(a.endpoint)
        assert conn is not None
        sock = conn.transport.get_extra_info("socket")
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 5
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 2
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 3
        # unacknowledged data (a request sent into a cut link) is given up on as soon, not after minutes
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 11_000
