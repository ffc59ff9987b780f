"""A lean HTTP/1.1 client for the engines: keep-alive connections, httptools' parser.

The gateway's hot path is one small POST and one small response per request;
aiohttp's client spent about half of the gateway's CPU on it (request and
response objects, header multidicts, cookie jars, tracing hooks, timers). This
is what is left: a pool of idle connections per endpoint (LIFO, closed after
`keepalive` seconds idle) and an asyncio.Protocol per connection that feeds
httptools and hands the proxy the status, the headers and the body chunks.

    pool = Pool(connect_timeout=5.0)
    conn = await pool.acquire("10.0.0.1:8000")         # raises UpstreamError("connect: ...")
    conn.send(head, body)
    await conn.headers_done()                          # raises UpstreamError before the first byte
    conn.status, conn.headers                          # int, [(bytes, bytes)]
    body = await conn.read_all()  /  chunk = await conn.read_chunk()   # b"" at the end
    pool.release(conn)                                 # back to the pool iff reusable, else closed

Without a task: `conn = pool.idle(endpoint)` (None if there is none), `conn.listener =
fn` (called after each piece of the response and on a failure: check `conn.failed`,
`conn.status`, `conn.complete`), `conn.send(head, body)`, then `conn.body()` once complete.

Failures are UpstreamError with a `reason` whose first word (before ':') is
the metrics label: connect, timeout, disconnected, protocol.

`response_timeout`: a request whose response headers have not come that many
seconds after it was sent fails with "timeout: ..." and its connection is
closed (an engine that accepts and never answers, or a stopped one).
`idle_timeout`: a response whose body has started and then brings no byte for
that many seconds fails the same way ("timeout: ..."), so a stream cut off
mid-way (a hung engine, a partition) ends instead of waiting for the link to
heal; time the gateway spends waiting on a slow client does not count. One
watchdog per pool looks at the connections in flight once a second, so the
hot path pays for a timestamp, a counter and a set, not a timer per request.

The pool knows its connections in flight (a set: an add and a discard per
request), so that `abandon(endpoint, ...)` can fail those to an engine that
left routing: a try still waiting for its headers goes elsewhere, and, when the
engine is known dead, a response under way ends (gateway.py decides which).

`tcp_keepalive`: TCP keepalive on every connection to an engine (set once, when
it opens), and TCP_USER_TIMEOUT to match, so that a peer silent at the TCP level
(a partition between the gateway and the engine alone, which the control plane
does not see) is known dead in idle + interval x probes seconds, whether the
connection waits for a response or has a request unacknowledged.
"""
from __future__ import annotations

import asyncio
import collections
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import httptools

from llmgw.gateway.response import write_message

HIGH_WATER = 256 * 1024  # body bytes buffered before reading from the engine pauses
LOW_WATER = 64 * 1024


CONNECT_TIMED_OUT = "timeout: connecting took too long"


@dataclass(frozen=True)
class Keepalive:
    """TCP keepalive on the connections to the engines: the first probe after `idle` seconds
    without a packet, then one every `interval` seconds; `probes` unanswered: the peer is dead."""

    idle: int = 5
    interval: int = 2
    probes: int = 3

    @property
    def bound(self) -> int:
        """Seconds after which a silent peer is known dead."""
        return self.idle + self.interval * self.probes

    def apply(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, self.idle)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, self.interval)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, self.probes)
        # data sent and never acknowledged (a request written into a cut link) is not probed
        # by keepalive: without this, retransmissions would go on for about 15 minutes
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, self.bound * 1000)


class UpstreamError(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Conn(asyncio.Protocol):
    """One keep-alive connection to an engine; one request at a time."""

    transport: asyncio.Transport  # set by connection_made, before create_connection returns the Conn

    def __init__(self, pool: "Pool", key: str):
        self.pool = pool
        self.key = key
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False  # the connection is gone (or going): never reuse
        self.idle_since = 0.0
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.keep_alive = False
        self.complete = False  # the whole response has been received
        self._got_headers = False
        self._until_eof = False  # neither Content-Length nor chunked: the body ends at EOF
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._paused = False
        self._whole = False  # read_all is waiting: never pause
        self._error: UpstreamError | None = None
        self._waiter: asyncio.Future[None] | None = None
        # called after each piece of input and on a failure, for a caller without a task
        self.listener: Callable[[], None] | None = None
        self._busy = False
        self.sent_at = 0.0   # when the request in flight was sent, or last seen making progress (monotonic)
        self.pieces = 0      # body pieces received; the watchdog compares it with what it saw last
        self.pieces_seen = 0

    # ------------------------------------------------------------ protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream's transport (uvloop's TCPTransport is one, without being a subclass)
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if not self._busy or self.complete:
            # Bytes nobody asked for (after a response, or on an idle connection): drop it.
            self.closed = True
            self.transport.close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as err:
            self._fail(UpstreamError(f"protocol: the engine sent a malformed response ({err})"))
            self.closed = True
            self.transport.close()
        if self.listener is not None:  # after the parser, so that it may reuse or close this connection
            self.listener()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self._busy or self.complete:
            return
        if self._got_headers and self._until_eof:
            self.complete = True
            self._wake()
        elif self._got_headers:
            self._fail(UpstreamError("disconnected: the engine closed the connection mid-response"))
        else:
            self._fail(UpstreamError("disconnected: the engine closed the connection"))
        if self.listener is not None:
            self.listener()

    def pause_writing(self) -> None:  # a large request body; the transport buffers it
        pass

    def resume_writing(self) -> None:
        pass

    # ------------------------------------------------------------ httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.pool.headers_came(self)
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()
        self._got_headers = True
        self._until_eof = True
        for name, _ in self.headers:
            n = name.lower()
            if n == b"content-length" or n == b"transfer-encoding":
                self._until_eof = False
                break
        if self._until_eof and (self.status < 200 or self.status in (204, 304)):
            self._until_eof = False  # no body at all
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.pieces += 1
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > HIGH_WATER and not self._paused and not self._whole:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.pool.answered(self)
        self.complete = True
        self._wake()

    # ------------------------------------------------------------ the proxy's side

    @property
    def gone(self) -> bool:
        """Closed, or closing: nothing more is sent on it."""
        return self.closed or self.transport.is_closing()

    def send(self, head: bytes, body: bytes) -> None:
        if self.gone:
            raise UpstreamError("disconnected: the engine closed the connection")
        self._busy = True
        write_message(self.transport, head, body)
        pool = self.pool
        pool.inflight.add(self)
        if pool.watched:
            self.sent_at = time.monotonic()
            pool.watch()

    async def headers_done(self) -> None:
        while not self._got_headers:
            if self._error is not None:
                raise self._error
            await self._wait()

    @property
    def failed(self) -> UpstreamError | None:
        return self._error

    def read_whole(self) -> None:
        """Buffer the whole body, however large (never pause reading)."""
        self._whole = True
        if self._paused:
            self._paused = False
            self.transport.resume_reading()

    async def read_all(self) -> bytes:
        self.read_whole()
        while not self.complete:
            if self._error is not None:
                raise self._error
            await self._wait()
        return self.body()

    def body(self) -> bytes:
        """The body received (all of it, once `complete`)."""
        chunks, self._chunks, self._buffered = self._chunks, collections.deque(), 0
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def read_chunk(self) -> bytes:
        """The body bytes received so far (at least one), or b'' once the body has ended."""
        while not self._chunks:
            if self.complete:
                return b""
            if self._error is not None:
                raise self._error
            await self._wait()
        if len(self._chunks) == 1:
            data = self._chunks.popleft()
        else:
            data = b"".join(self._chunks)
            self._chunks.clear()
        self._buffered = 0
        if self._paused:
            self._paused = False
            self.transport.resume_reading()
        return data

    def close(self) -> None:
        self.closed = True
        self.pool.answered(self)
        self.transport.close()

    @property
    def started(self) -> bool:
        """Whether the response's headers have come."""
        return self._got_headers

    def end(self, err: UpstreamError) -> None:
        """Fail the request in flight with `err` and close: no response headers in time, a body
        that stopped, an engine that left routing."""
        self._fail(err)
        self.close()
        if self.listener is not None:
            self.listener()

    # ------------------------------------------------------------ internals

    def _fail(self, err: UpstreamError) -> None:
        self.pool.answered(self)
        if self._error is None:
            self._error = err
        self._wake()

    async def _wait(self) -> None:
        self._waiter = fut = asyncio.get_running_loop().create_future()
        try:
            await fut
        finally:
            self._waiter = None

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _reset(self) -> None:
        self.status = 0
        self.headers = []
        self.keep_alive = False
        self.complete = False
        self._got_headers = False
        self._until_eof = False
        self._chunks.clear()
        self._buffered = 0
        self._whole = False
        self._error = None
        self.listener = None
        self._busy = False


class Pool:
    """Idle keep-alive connections per endpoint ("host:port"); no limit on their number."""

    def __init__(self, connect_timeout: float = 5.0, keepalive: float = 30.0,
                 response_timeout: float | None = None, idle_timeout: float | None = None,
                 tcp_keepalive: Keepalive | None = None):
        self.connect_timeout = connect_timeout
        self.keepalive = keepalive
        self.response_timeout = response_timeout
        self.idle_timeout = idle_timeout
        self.tcp_keepalive = tcp_keepalive
        self.watched = response_timeout is not None or idle_timeout is not None
        self._idle: dict[str, list[Conn]] = {}
        self._sweeper: asyncio.TimerHandle | None = None
        self.inflight: set[Conn] = set()     # sent, response not yet whole
        self._watchdog: asyncio.TimerHandle | None = None
        self._closed = False

    def watch(self) -> None:
        """The watchdog looks at the connections in flight within a second."""
        if self._watchdog is None and not self._closed:
            self._watchdog = asyncio.get_running_loop().call_later(1.0, self._watch)

    def headers_came(self, conn: Conn) -> None:
        """The response started: from now on only the idle timeout watches it."""
        if self.idle_timeout is not None:
            conn.sent_at, conn.pieces_seen = time.monotonic(), conn.pieces

    def answered(self, conn: Conn) -> None:
        self.inflight.discard(conn)

    def abandon(self, endpoint: str, reason: str, started: bool) -> int:
        """Fail (UpstreamError(reason)) the requests in flight to `endpoint` still waiting for
        their response headers, and with `started` those whose response is under way too; how many."""
        gone = [c for c in self.inflight if c.key == endpoint and (started or not c.started)]
        for conn in gone:
            conn.end(UpstreamError(reason))
        return len(gone)

    def _watch(self) -> None:
        self._watchdog = None
        now = time.monotonic()
        late: list[tuple[Conn, str]] = []
        for conn in self.inflight:
            if not conn._got_headers:
                if self.response_timeout is not None and now - conn.sent_at > self.response_timeout:
                    late.append((conn, f"no response within {self.response_timeout:g}s"))
            elif self.idle_timeout is None:
                continue
            elif conn.pieces != conn.pieces_seen or conn._paused:  # progress, or waiting on the client
                conn.pieces_seen, conn.sent_at = conn.pieces, now
            elif now - conn.sent_at > self.idle_timeout:
                late.append((conn, f"the response stopped for {self.idle_timeout:g}s mid-way"))
        for conn, why in late:
            conn.end(UpstreamError(f"timeout: {why}"))
        if self.inflight and not self._closed:
            self._watchdog = asyncio.get_running_loop().call_later(1.0, self._watch)

    async def acquire(self, endpoint: str, fresh: bool = False) -> Conn:
        conn = None if fresh else self.idle(endpoint)
        return conn if conn is not None else await self._connect(endpoint)

    def idle(self, endpoint: str) -> Conn | None:
        """An idle connection to `endpoint` (the last one released), or None."""
        idle = self._idle.get(endpoint)
        while idle:
            conn = idle.pop()
            if not conn.gone:
                return conn
        return None

    def release(self, conn: Conn) -> None:
        """Back to the pool if the response was read to its end and may be reused; else closed."""
        if conn.closed or not conn.complete or not conn.keep_alive or conn._paused or self._closed:
            conn.close()
            return
        conn._reset()
        conn.idle_since = time.monotonic()
        self._idle.setdefault(conn.key, []).append(conn)
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().call_later(self.keepalive / 2, self._sweep)

    def close(self) -> None:
        self._closed = True
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()

    def idle_count(self, endpoint: str | None = None) -> int:
        if endpoint is not None:
            return sum(1 for c in self._idle.get(endpoint, ()) if not c.closed)
        return sum(1 for conns in self._idle.values() for c in conns if not c.closed)

    async def _connect(self, endpoint: str) -> Conn:
        host, _, port = endpoint.rpartition(":")
        host = host.strip("[]")
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: Conn(self, endpoint), host, int(port)), self.connect_timeout)
        except asyncio.TimeoutError:
            raise UpstreamError(CONNECT_TIMED_OUT) from None
        except (OSError, ValueError) as err:
            why = getattr(err, "strerror", None) or str(err) or type(err).__name__
            raise UpstreamError(f"connect: {why}") from None
        if conn.gone:
            # reset by the engine before this task resumed (a stopping engine closes the connections
            # left in its listen backlog): its socket is closed already, and nothing was sent
            raise UpstreamError("connect: the engine closed the connection at once")
        if self.tcp_keepalive is not None:
            sock = conn.transport.get_extra_info("socket")
            if sock is not None:
                self.tcp_keepalive.apply(sock)
        return conn

    def _sweep(self) -> None:
        self._sweeper = None
        cutoff = time.monotonic() - self.keepalive
        for key in list(self._idle):
            conns = self._idle[key]
            keep = []
            for conn in conns:
                if conn.closed:
                    continue
                if conn.idle_since < cutoff:
                    conn.close()
                else:
                    keep.append(conn)
            if keep:
                self._idle[key] = keep
            else:
                del self._idle[key]
        if self._idle and not self._closed:
            self._sweeper = asyncio.get_running_loop().call_later(self.keepalive / 2, self._sweep)


async def accepts(endpoint: str, timeout: float) -> bool:
    """Whether the engine at `endpoint` accepts a connection within `timeout` (an ejected
    replica's way back: outlier.py)."""
    host, _, port = endpoint.rpartition(":")
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host.strip("[]"), int(port)), timeout)
    except (OSError, ValueError, asyncio.TimeoutError):
        return False
    writer.close()
    return True
