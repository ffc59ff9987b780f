"""The gateway's own HTTP/1.1 server (llmgw/gateway/server.py), spoken to over raw sockets."""
from __future__ import annotations

import asyncio
import json
import re
import urllib.request

import pytest

from llmgw.gateway.table import RoutingTable
from tests.helpers.gateway import Sim, model, replica, running_gateway


@pytest.fixture(scope="module")
def sim():
    s = Sim.start("llama")
    yield s
    s.stop()


def table_for(endpoint: str) -> RoutingTable:
    t = RoutingTable()
    t.apply("models", "ADDED", model("llama"))
    t.apply("replicas", "ADDED", replica("llama-0", "llama", endpoint, served=("llama",)))
    return t


def post(body: bytes, extra: bytes = b"") -> bytes:
    return (b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n%s\r\n%s" % (len(body), extra, body))


COMPLETION = json.dumps({"model": "llama", "prompt": "x", "max_tokens": 1}).encode()


async def exchange(url: str, data: bytes, *, half_close: bool = False) -> bytes:
    """Send `data`, then read until the gateway closes the connection."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(data)
    if half_close:
        writer.write_eof()
    try:
        return await asyncio.wait_for(reader.read(), 20)
    finally:
        writer.close()


def responses(raw: bytes) -> list[tuple[int, dict, bytes]]:
    """Split a stream of Content-Length responses into (status, headers, body)."""
    out = []
    while raw:
        head, _, rest = raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers = {k.lower(): v for k, _, v in (ln.partition(": ") for ln in lines[1:])}
        n = int(headers.get("content-length", 0))
        out.append((status, headers, rest[:n]))
        raw = rest[n:]
    return out


async def test_pipelined_requests_are_answered_in_order(sim):
    async with running_gateway(table_for(sim.endpoint)) as gw:
        raw = await exchange(gw.url, post(COMPLETION) + b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n"
                             + post(b'{"model": "nope"}') + b"GET /v1/models HTTP/1.1\r\nHost: gw\r\n"
                             b"Connection: close\r\n\r\n")
    got = responses(raw)
    assert [status for status, _, _ in got] == [200, 200, 404, 200]
    assert json.loads(got[0][2])["object"] == "text_completion" and got[0][1]["x-llmgw-replica"] == "llama-0"
    assert json.loads(got[1][2])["status"] == "ok"
    assert json.loads(got[2][2])["error"]["code"] == "model_not_found"
    assert [m["id"] for m in json.loads(got[3][2])["data"]] == ["llama"]
    assert got[3][1]["connection"] == "close"


async def test_a_chunked_request_body_is_forwarded(sim):
    async with running_gateway(table_for(sim.endpoint)) as gw:
        half = len(COMPLETION) // 2
        chunked = b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (half, COMPLETION[:half], len(COMPLETION) - half,
                                                         COMPLETION[half:])
        raw = await exchange(gw.url, b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n"
                             b"Transfer-Encoding: chunked\r\n\r\n" + chunked)
    [(status, _, body)] = responses(raw)
    assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 1


async def test_a_malformed_request_is_a_400_after_the_requests_before_it():
    async with running_gateway(RoutingTable()) as gw:
        raw = await exchange(gw.url, b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\nNOT HTTP AT ALL\r\n\r\n")
    got = responses(raw)  # read to EOF: the gateway closed the connection
    assert [status for status, _, _ in got] == [200, 400]
    assert got[1][1]["connection"] == "close"
    assert "Malformed HTTP request" in json.loads(got[1][2])["error"]["message"]


async def test_a_head_over_the_limit_is_a_431():
    async with running_gateway(RoutingTable()) as gw:
        raw = await exchange(gw.url, b"GET /healthz HTTP/1.1\r\nHost: gw\r\n"
                             + b"X-Big: %s\r\n" % (b"a" * 70_000) + b"\r\n")
    [(status, _, body)] = responses(raw)
    assert status == 431 and json.loads(body)["error"]["code"] == "request_headers_too_large"


async def test_a_body_over_the_limit_is_refused_before_it_is_sent():
    async with running_gateway(table_for("127.0.0.1:9"), max_body_bytes=100) as gw:
        # Expect: 100-continue and a Content-Length over the limit: a 413 instead of "100 Continue",
        # and the connection closes (the body was never read).
        raw = await exchange(gw.url, b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: 5000\r\n"
                             b"Expect: 100-continue\r\n\r\n")
        [(status, headers, body)] = responses(raw)
        assert status == 413 and headers["connection"] == "close"
        assert json.loads(body)["error"]["code"] == "request_too_large"


async def test_expect_100_continue_is_answered_when_the_body_is_wanted(sim):
    async with running_gateway(table_for(sim.endpoint)) as gw:
        host, port = gw.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(post(b"", b"Expect: 100-continue\r\n").replace(b"Content-Length: 0",
                                                                       b"Content-Length: %d" % len(COMPLETION)))
            assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10) == b"HTTP/1.1 100 Continue\r\n\r\n"
            writer.write(COMPLETION)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            assert head.startswith(b"HTTP/1.1 200 ")
            length = int(re.search(rb"Content-Length: (\d+)", head).group(1))
            assert json.loads(await reader.readexactly(length))["model"] == "llama"
        finally:
            writer.close()


async def test_http10_and_a_half_closed_client_get_their_answers(sim):
    async with running_gateway(table_for(sim.endpoint)) as gw:
        raw = await exchange(gw.url, b"GET /healthz HTTP/1.0\r\n\r\n")
        [(status, headers, _)] = responses(raw)
        assert raw.startswith(b"HTTP/1.1 200 ") and headers["connection"] == "close"
        # Both requests sent, then the client's side closed: both still answered.
        raw = await exchange(gw.url, post(COMPLETION) + post(COMPLETION), half_close=True)
        assert [status for status, _, _ in responses(raw)] == [200, 200]


async def test_unknown_paths_and_wrong_methods():
    async with running_gateway(RoutingTable()) as gw:
        raw = await exchange(gw.url, b"GET /nowhere HTTP/1.1\r\nHost: gw\r\n\r\n"
                             b"GET /v1/completions HTTP/1.1\r\nHost: gw\r\n\r\n"
                             b"HEAD /healthz HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
    not_found, wrong, head = raw.split(b"HTTP/1.1 ")[1:]
    assert not_found.startswith(b"404 ") and b'"code": "not_found"' in not_found
    assert wrong.startswith(b"405 ") and b"Allow: POST\r\n" in wrong
    assert head.startswith(b"200 ") and head.endswith(b"\r\n\r\n")  # a HEAD answer has no body


def engine_running(endpoint: str) -> float:
    with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=5) as r:
        text = r.read().decode()
    return float(re.search(r"^vllm:num_requests_running(?:\{[^}]*\})? (\S+)$", text, re.M).group(1))


async def test_a_client_that_leaves_mid_stream_stops_the_engine():
    slow = Sim.start("llama", extra=["--tokens-per-second", "5"])
    try:
        async with running_gateway(table_for(slow.endpoint)) as gw:
            host, port = gw.url.removeprefix("http://").split(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            body = json.dumps({"model": "llama", "prompt": "x", "max_tokens": 500, "stream": True}).encode()
            writer.write(post(body))
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            assert head.startswith(b"HTTP/1.1 200 ") and b"Transfer-Encoding: chunked" in head
            assert b"data: " in await asyncio.wait_for(reader.readuntil(b"data: "), 10)
            assert engine_running(slow.endpoint) == 1 and gw.gateway.balancer.inflight.get("llama-0") == 1
            writer.close()  # 500 tokens at 5/s: the engine would still be generating for 100 s
            for _ in range(200):
                if engine_running(slow.endpoint) == 0 and not gw.gateway.balancer.inflight.get("llama-0"):
                    break
                await asyncio.sleep(0.05)
            assert engine_running(slow.endpoint) == 0
            assert not gw.gateway.balancer.inflight.get("llama-0")
    finally:
        slow.stop()
