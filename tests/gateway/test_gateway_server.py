"""The gateway's own HTTP/1.1 server (llmgw/gateway/http1.py), spoken to over raw sockets."""
from __future__ import annotations

import asyncio
import json
import re
import subprocess
import urllib.request

import pytest

from llmgw.dev.process import free_port
from llmgw.gateway.http1 import Limits
from llmgw.gateway.table import RoutingTable
from tests.fixtures.gateway import CLI, Sim, model, replica, running_gateway
from tests.fixtures.poll import until


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


async def connect(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = url.removeprefix("http://").split(":")
    return await asyncio.open_connection(host, int(port))


async def until_closed(reader: asyncio.StreamReader) -> bytes:
    """What the gateway sends until it closes the connection (bounded far above the test's timeouts)."""
    return await asyncio.wait_for(reader.read(), 20)


async def exchange(url: str, data: bytes, *, half_close: bool = False) -> bytes:
    """Send `data`, then read until the gateway closes the connection."""
    reader, writer = await connect(url)
    writer.write(data)
    if half_close:
        writer.write_eof()
    try:
        return await until_closed(reader)
    finally:
        writer.close()


async def response(reader: asyncio.StreamReader) -> tuple[int, dict, bytes]:
    """One Content-Length response from a connection that stays open."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 20)
    [(status, headers, _)] = responses(head)
    return status, headers, await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), 20)


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


def _chunked(body: bytes) -> bytes:
    half = len(body) // 2
    return b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n%x;ext=1\r\n%s\r\n0\r\nX-Trailer: t\r\n\r\n" % (
        half, body[:half], len(body) - half, body[half:])


@pytest.mark.parametrize("framing", [_chunked, lambda body: b"Content-Length: %d\r\n\r\n%s" % (len(body), body)],
                         ids=["chunked", "content-length"])
async def test_a_body_is_fed_to_the_parser_whole_not_line_by_line(sim, framing):
    # Heads and chunk-size lines are cut where they end (to read them: the 413s above); a body
    # is not, or one of blank lines costs a parser call per line (and a copy of the rest per call).
    lines = 100_000
    body = COMPLETION[:1] + b"\r\n\r\n" * lines + COMPLETION[1:]   # JSON: whitespace between tokens
    async with running_gateway(table_for(sim.endpoint)) as gw:
        reader, writer, parser = await spied(gw)
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\n" + framing(body)
                     + b"GET /healthz HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
        raw = await until_closed(reader)
        writer.close()
    [(status, _, answer), (health, _, _)] = responses(raw)
    assert status == 200 and json.loads(answer)["usage"]["completion_tokens"] == 1
    assert health == 200
    assert parser.fed < lines // 100   # a few pieces per segment read, whatever the lines


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


class _CountingParser:
    """A connection's real parser, counting the pieces it is fed."""

    def __init__(self, parser) -> None:
        self.parser, self.fed = parser, 0

    def feed_data(self, data) -> None:
        self.fed += 1
        self.parser.feed_data(data)

    def __getattr__(self, name):
        return getattr(self.parser, name)


async def spied(gw) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, _CountingParser]:
    """A connection to the gateway, and its parser, counting."""
    reader, writer = await connect(gw.url)
    [conn] = await until(lambda: list(gw.gateway.server.conns), "the connection accepted")
    conn.parser = _CountingParser(conn.parser)
    return reader, writer, conn.parser


async def send_apart(writer: asyncio.StreamWriter, parser: _CountingParser, pieces: list[bytes]) -> None:
    """Send each piece once the gateway has read the one before: in segments apart (else they
    may come in one)."""
    writer.write(pieces[0])
    for piece in pieces[1:]:
        await until(lambda fed=parser.fed: parser.fed > fed, "the gateway read what came before")
        writer.write(piece)


@pytest.mark.parametrize("pieces", [   # after the head's start, in segments apart
    [b"\r\nffffffff\r\n{"],                        # the first chunk announces 4 GiB, with the head
    [b"\r\n", b"ffffffff\r\n{"],                     # after it
    [b"\r\n2\r\n{}\r\n", b"6", b"3;ext=1\r\n"],    # the second, its size line split
    [b"\r", b"\nffffffff\r\n{"],                     # the first, the head's end split
], ids=["first-chunk", "first-chunk-apart", "second-chunk-split", "head-end-split"])
async def test_a_chunk_over_the_limit_is_a_413_at_once(pieces):
    # The body's bytes never come: without a look at the chunk's size, the answer would wait for
    # the body timeout (an hour here, far past until_closed's bound).
    async with running_gateway(table_for("127.0.0.1:9"), max_body_bytes=100,
                               limits=Limits(body_timeout=3600)) as gw:
        reader, writer, parser = await spied(gw)
        await send_apart(writer, parser, [
            b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n" + pieces[0], *pieces[1:]])
        raw = await until_closed(reader)
        writer.close()
    [(status, headers, body)] = responses(raw)
    assert status == 413 and headers["connection"] == "close"
    assert json.loads(body)["error"]["code"] == "request_too_large"


@pytest.mark.parametrize("pieces", [
    [b"GET /healthz\r\n"],                           # HTTP/0.9: one line, then its client waits
    [b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\nGET /", b"healthz\r", b"\n"],   # after a request, split
    [b"GET /healthz\r\n\r\n"],                       # with a blank line after it
    [b"GET /healthz HTTP/2.0\r\nHost: gw\r\n\r\n"],
], ids=["http0.9", "http0.9-split-after-a-request", "http0.9-blank-line", "http2.0"])
async def test_a_request_line_that_is_not_http1_is_a_400_and_a_close(pieces):
    # At once: not at the header timeout (an hour here, far past until_closed's bound).
    async with running_gateway(RoutingTable(), limits=Limits(header_timeout=3600)) as gw:
        reader, writer, parser = await spied(gw)
        await send_apart(writer, parser, pieces)
        raw = await until_closed(reader)
        writer.close()
    *before, (status, headers, body) = responses(raw)   # read to EOF: the gateway closed the connection
    assert [s for s, _, _ in before] == [200] * (len(pieces) > 1)
    assert status == 400 and headers["connection"] == "close"
    assert "is not spoken here" in json.loads(body)["error"]["message"]


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
            await until(lambda: engine_running(slow.endpoint) == 0 and not gw.gateway.balancer.inflight.get("llama-0"),
                        "the engine to stop generating and the replica to be released")
    finally:
        slow.stop()


HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n"
HEALTHZ_CLOSE = b"GET /healthz HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n"
HALF_HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: appl"


def last_word(raw: bytes) -> tuple[int, str | None]:
    """The status and error code of the one answer the gateway sent before it closed the connection."""
    [(status, headers, body)] = responses(raw)
    assert headers["connection"] == "close"
    return status, json.loads(body)["error"]["code"]


async def test_a_head_that_never_ends_is_a_408_and_a_silent_connection_is_closed():
    async with running_gateway(RoutingTable(), limits=Limits(header_timeout=0.3)) as gw:
        slow = [await connect(gw.url) for _ in range(4)]
        for _, writer in slow:
            writer.write(HALF_HEAD)  # slowloris: a head begun and never finished
        silent_reader, silent = await connect(gw.url)
        for reader, writer in slow:
            assert last_word(await until_closed(reader)) == (408, "request_timeout")
            writer.close()
        assert await until_closed(silent_reader) == b""  # nothing asked: closed without a word
        silent.close()
        # A whole request, then a head that stops: the first is answered, then the 408.
        raw = await exchange(gw.url, HEALTHZ + HALF_HEAD)
        assert [status for status, _, _ in responses(raw)] == [200, 408]
        assert not gw.gateway.server.conns


async def test_a_body_that_stops_coming_is_a_408():
    async with running_gateway(RoutingTable(), limits=Limits(body_timeout=0.3)) as gw:
        cut = post(COMPLETION)[:-5]  # the head and most of the body, never the rest
        chunk = b"%x\r\n%s\r\n" % (len(COMPLETION), COMPLETION)
        for data in (cut, b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk):
            assert last_word(await exchange(gw.url, data)) == (408, "request_timeout")


async def test_a_slow_body_gets_more_time_while_it_keeps_the_minimum_rate():
    # 100 kB in ten pieces at most 10 kB/s: each piece buys a second more than the 0.3 s
    # body timeout, far more than the pauses between them.
    doc = json.dumps({"model": "nope", "prompt": "x" * 100_000}).encode()
    async with running_gateway(RoutingTable(), limits=Limits(body_timeout=0.3, body_min_rate=10_000)) as gw:
        reader, writer = await connect(gw.url)
        data = post(doc)
        step = len(data) // 10 + 1
        for i in range(0, len(data), step):
            writer.write(data[i:i + step])
            await asyncio.sleep(0.2)  # the client's pace, the input under test (not a wait for the gateway)
        status, _, body = await response(reader)
        writer.close()
    assert status == 404 and json.loads(body)["error"]["code"] == "model_not_found"  # the body was read whole


async def test_a_malformed_chunk_size_is_a_400_and_the_connection_closes():
    async with running_gateway(RoutingTable()) as gw:
        raw = await exchange(gw.url, b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n"
                             b"\r\n2\r\n{}\r\nzz\r\n")
    [(status, headers, body)] = responses(raw)  # read to EOF: the gateway closed the connection
    assert status == 400 and headers["connection"] == "close"
    assert "chunk size" in json.loads(body)["error"]["message"]


async def test_connections_over_the_cap_per_address_are_refused_with_429():
    async with running_gateway(RoutingTable(), limits=Limits(max_conns_per_addr=2)) as gw:
        kept = [await connect(gw.url) for _ in range(2)]
        for reader, writer in kept:
            writer.write(HEALTHZ)
            assert (await response(reader))[0] == 200
        assert last_word(await exchange(gw.url, HEALTHZ)) == (429, "too_many_connections")
        for reader, writer in kept:  # those within the cap go on as before
            writer.write(HEALTHZ)
            assert (await response(reader))[0] == 200
        kept[0][1].close()
        async def let_in():  # once the gateway has seen a connection close, one more is let in
            [(status, _, _)] = responses(await exchange(gw.url, HEALTHZ_CLOSE))
            return status == 200
        await until(let_in, "a connection let in after one of the two closed")
        kept[1][1].close()


async def test_a_keep_alive_client_is_unaffected_and_an_idle_one_is_closed():
    limits = Limits(header_timeout=0.3, body_timeout=0.3, keepalive=30.0)
    async with running_gateway(RoutingTable(), limits=limits) as gw:
        reader, writer = await connect(gw.url)
        for _ in range(3):
            writer.write(post(b'{"model": "nope"}'))
            assert (await response(reader))[0] == 404
            # Idle longer than the head and body timeouts: a silent connection opened after the
            # answer is closed by them, the idle one stays (only the keep-alive timeout applies).
            witness_reader, witness = await connect(gw.url)
            assert await until_closed(witness_reader) == b""
            witness.close()
        writer.write(HEALTHZ)
        assert (await response(reader))[0] == 200
        writer.close()
    async with running_gateway(RoutingTable(), limits=Limits(keepalive=0.3)) as gw:
        reader, writer = await connect(gw.url)
        writer.write(HEALTHZ)
        assert (await response(reader))[0] == 200
        assert await until_closed(reader) == b""
        writer.close()


async def test_the_gateway_command_sets_the_limits(tmp_path):
    routes = tmp_path / "routes.yaml"
    routes.write_text("apiVersion: llmgw.io/v1\nkind: Model\nmetadata: {name: llama}\n"
                      "spec: {profiles: [{engine: sim}]}\n")
    url = f"http://127.0.0.1:{free_port()}"
    proc = subprocess.Popen([*CLI, "gateway", "--listen", url.removeprefix("http://"), "--static", str(routes),
                             "--header-timeout", "0.3", "--max-conns-per-addr", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        async def let_in():  # it listens, and has seen the connections of earlier tries close
            reader, writer = await connect(url)
            writer.write(HEALTHZ)
            if (await response(reader))[0] == 200:
                return reader, writer
            writer.close()
            return None
        # `writer` holds the one connection the cap allows this address
        reader, writer = await until(let_in, "the gateway to answer 200", retry=(OSError,))
        assert last_word(await exchange(url, HEALTHZ)) == (429, "too_many_connections")
        writer.write(HALF_HEAD)
        assert last_word(await until_closed(reader)) == (408, "request_timeout")
        writer.close()
    finally:
        proc.terminate()
        proc.wait(10)
