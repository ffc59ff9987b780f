"""The gateway's upstream client (keep-alive pool, httptools) against in-process fake engines.

The sim engine answers one way (small JSON or SSE, always with a length or
chunked SSE); these fakes answer the other ways an engine may: chunked JSON,
bodies over the buffering limit, repeated headers, a body cut short, garbage,
idle connections closed by the engine. Tests marked `warm` run twice: on a
new connection (the exchange starts in a task) and on an idle one (it starts
from the server's callback, without a task, and goes on in one when it must).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
import threading

import aiohttp
import pytest
from aiohttp import web

from llmgw.gateway.proxy import _BUFFER_LIMIT, REPLICA_HEADER
from llmgw.gateway.table import RoutingTable
from llmgw.gateway.upstream import Keepalive, Pool, UpstreamError
from tests.fixtures.gateway import metric, model, replica, running_gateway, scrape
from tests.fixtures.poll import until

BIG = bytes(range(256)) * (_BUFFER_LIMIT // 256 * 2 + 3)  # over the limit: streamed, not buffered


@contextlib.asynccontextmanager
async def fake_engine(keepalive_timeout: float = 75.0):
    """An aiohttp app as an engine; yields (endpoint, seen): seen lists (peer port, headers, body)."""
    seen: list[tuple[int, dict, bytes]] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        seen.append((request.transport.get_extra_info("peername")[1], dict(request.headers), body))
        doc = json.loads(body)
        kind = doc.get("kind", "json")
        if kind == "json":
            return web.json_response({"echo": doc})
        if kind == "chunked":
            resp = web.StreamResponse(headers={"Content-Type": "application/json"})
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            for piece in (b'{"a": ', b'1, "b": ', b'2}'):
                await resp.write(piece)
            await resp.write_eof()
            return resp
        if kind == "hang":  # answers nothing until the caller's connection is gone
            while request.transport is not None and not request.transport.is_closing():
                await asyncio.sleep(0.02)
            seen.append((0, {}, b"gone"))
            return web.Response()
        if kind == "unavailable":
            return web.json_response({"error": "loading"}, status=503)
        if kind == "big":
            return web.Response(body=BIG, content_type="application/octet-stream")
        if kind == "cookies":
            resp = web.Response(body=b"{}", content_type="application/json")
            resp.headers.add("Set-Cookie", "a=1")
            resp.headers.add("Set-Cookie", "b=2")
            return resp
        if kind in ("cut", "cut-big"):  # promises a body, sends 10 bytes of it, drops the connection
            resp = web.StreamResponse(headers={"Content-Type": "application/json"})
            resp.content_length = 1000 if kind == "cut" else _BUFFER_LIMIT + 1
            await resp.prepare(request)
            await resp.write(b"0123456789")
            await asyncio.sleep(0.05)
            request.transport.close()
            return resp
        raise AssertionError(kind)

    app = web.Application()
    app.router.add_post("/v1/completions", handler)
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=keepalive_timeout)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"127.0.0.1:{runner.addresses[0][1]}", seen
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def raw_engine(answer: bytes):
    """A TCP server that reads a request and writes `answer`, whatever it was asked."""
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()


def table_for(endpoint: str) -> RoutingTable:
    t = RoutingTable()
    t.apply("models", "ADDED", model("fake"))
    t.apply("replicas", "ADDED", replica("fake-0", "fake", endpoint))
    return t


async def ask(s: aiohttp.ClientSession, url: str, kind: str, headers: dict | None = None):
    async with s.post(url + "/v1/completions", json={"model": "fake", "kind": kind}, headers=headers) as r:
        return r.status, r.headers, await r.read()


async def test_connections_are_kept_alive_and_headers_and_body_forwarded():
    async with fake_engine() as (endpoint, seen), running_gateway(table_for(endpoint)) as gw, \
            aiohttp.ClientSession() as s:
        for _ in range(20):
            status, headers, body = await ask(s, gw.url, "json",
                                              {"X-Trace": "t-1", "Authorization": "Bearer secret"})
            assert status == 200 and headers[REPLICA_HEADER] == "fake-0"
            assert json.loads(body) == {"echo": {"model": "fake", "kind": "json"}}
        assert len({port for port, _, _ in seen}) == 1  # one upstream connection, reused
        _, forwarded, raw = seen[0]
        assert forwarded["X-Trace"] == "t-1" and "Authorization" not in forwarded
        assert forwarded["Host"] == endpoint and int(forwarded["Content-Length"]) == len(raw)
        assert gw.gateway.pool.idle_count(endpoint) == 1


warm = pytest.mark.parametrize("warm", [False, True], ids=["new-connection", "idle-connection"])


async def warm_up(s: aiohttp.ClientSession, gw, endpoint: str, warm: bool) -> None:
    """With `warm`, leave one idle connection to the engine in the gateway's pool."""
    if warm:
        assert (await ask(s, gw.url, "json"))[0] == 200
    assert gw.gateway.pool.idle_count(endpoint) == (1 if warm else 0)


@contextlib.asynccontextmanager
async def gateway_to_fake(warm: bool):
    """A fake engine, a gateway to it and a client session; yields (endpoint, seen, gw, session)."""
    async with fake_engine() as (endpoint, seen), running_gateway(table_for(endpoint)) as gw, \
            aiohttp.ClientSession() as s:
        await warm_up(s, gw, endpoint, warm)
        yield endpoint, seen, gw, s


@warm
async def test_chunked_big_and_repeated_header_responses_are_relayed_whole(warm):
    async with gateway_to_fake(warm) as (endpoint, _, gw, s):
        status, headers, body = await ask(s, gw.url, "chunked")
        assert status == 200 and json.loads(body) == {"a": 1, "b": 2}
        status, headers, body = await ask(s, gw.url, "big")
        assert status == 200 and body == BIG and int(headers["Content-Length"]) == len(BIG)
        status, headers, body = await ask(s, gw.url, "cookies")
        assert status == 200 and headers.getall("Set-Cookie") == ["a=1", "b=2"]
        assert headers[REPLICA_HEADER] == "fake-0"
        # Every response was read to its end: the connection went back to the pool.
        assert gw.gateway.pool.idle_count(endpoint) == 1


@warm
async def test_a_body_cut_short_is_retried_if_buffered_else_closes_the_callers_connection(warm):
    async with gateway_to_fake(warm) as (endpoint, _, gw, s):
        # A small body is read whole before anything is sent: tried twice, then a 502.
        status, _, body = await ask(s, gw.url, "cut")
        assert status == 502 and "mid-response" in json.loads(body)["error"]["message"]
        # A body over the buffering limit is streamed: the caller's connection is closed.
        with pytest.raises(aiohttp.ClientPayloadError):
            await ask(s, gw.url, "cut-big")
        await warm_up(s, gw, endpoint, warm)
        status, _, _ = await ask(s, gw.url, "json")  # the gateway is fine afterwards
        assert status == 200
        text = await scrape(s, gw)
        assert metric(text, "llmgw_gateway_upstream_errors_total", reason="disconnected") == 2
        assert metric(text, "llmgw_gateway_upstream_errors_total", reason="midstream") == 1


@warm
async def test_an_engine_503_is_tried_once_more_then_is_a_503_with_retry_after(warm):
    async with gateway_to_fake(warm) as (endpoint, seen, gw, s):
        status, headers, body = await ask(s, gw.url, "unavailable")
        assert status == 503 and headers["Retry-After"] == "2"
        assert json.loads(body)["error"]["code"] == "no_ready_replica"
        assert [b for _, _, b in seen].count(b'{"model": "fake", "kind": "unavailable"}') == 2
        text = await scrape(s, gw)
        assert metric(text, "llmgw_gateway_upstream_errors_total", reason="unavailable") == 2
        assert metric(text, "llmgw_gateway_retries_total") == 1
        assert metric(text, "llmgw_gateway_requests_total", model="fake", code="503") == 1
        assert not gw.gateway.balancer.inflight
        assert (await ask(s, gw.url, "json"))[0] == 200


@warm
async def test_a_caller_that_leaves_before_the_answer_closes_the_engines_connection(warm):
    """On an idle connection the exchange runs from callbacks, with no task to cancel: the
    engine's connection must be closed all the same (so that it stops generating)."""
    async with gateway_to_fake(warm) as (endpoint, seen, gw, s):
        host, port = gw.url.removeprefix("http://").split(":")
        _, writer = await asyncio.open_connection(host, int(port))
        body = json.dumps({"model": "fake", "kind": "hang"}).encode()
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: %d\r\n\r\n%s"
                     % (len(body), body))
        await until(lambda: seen and seen[-1][2] == body, "the engine to have the request")
        # The caller leaves: a reset (a plain close reads as a half-close, which still wants its answer).
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.close()
        await until(lambda: seen[-1][2] == b"gone", "the engine to see its connection closed")
        assert not gw.gateway.balancer.inflight and gw.gateway.pool.idle_count(endpoint) == 0
        text = await scrape(s, gw)
        assert metric(text, "llmgw_gateway_requests_total", model="fake", code="499") == 1


async def test_idle_connections_closed_by_the_engine_are_not_reused():
    async with fake_engine(keepalive_timeout=0.2) as (endpoint, seen), \
            running_gateway(table_for(endpoint)) as gw, aiohttp.ClientSession() as s:
        for _ in range(3):
            status, _, _ = await ask(s, gw.url, "json")
            assert status == 200
            await asyncio.sleep(0.5)  # the engine drops the idle connection meanwhile
        assert len({port for port, _, _ in seen}) == 3
        text = await scrape(s, gw)
        assert metric(text, "llmgw_gateway_retries_total") == 0


async def test_a_malformed_response_is_a_502():
    async with raw_engine(b"this is not HTTP\r\n\r\n") as endpoint, \
            running_gateway(table_for(endpoint)) as gw, aiohttp.ClientSession() as s:
        status, _, body = await ask(s, gw.url, "json")
        assert status == 502
        err = json.loads(body)["error"]
        assert err["code"] == "upstream_unreachable" and "malformed" in err["message"]


async def test_a_connection_the_engine_resets_as_it_accepts_is_a_failed_connect():
    """A stopping engine resets the connections left in its backlog: one reset before the
    connecting task resumes had closed the socket the keepalive options were set on (a
    gateway error, EBADF, where the request is to be tried elsewhere: 1 in 3 here before)."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=128)

    def reset_each() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.close()

    threading.Thread(target=reset_each, daemon=True).start()
    pool = Pool(tcp_keepalive=Keepalive())
    outcomes = set()
    try:
        for _ in range(200):
            try:
                await pool.acquire(f"127.0.0.1:{listener.getsockname()[1]}", fresh=True)
                outcomes.add("connected")
            except UpstreamError as err:
                outcomes.add(err.reason.split(":")[0])
    finally:
        listener.close()
        pool.close()
    assert outcomes <= {"connected", "connect"}
