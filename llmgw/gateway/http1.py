"""The gateway's client-facing HTTP/1.1 server: an asyncio Protocol on httptools' request parser.

aiohttp's server cost about a third of the gateway's CPU per proxied request
(request, payload and response objects, header multidicts, a router, timers).
This is what the gateway needs of it:

    server = HttpServer(handler, max_body=16 << 20, limits=Limits(), begin=None)
    await server.start("0.0.0.0", 8000)
    await server.close(grace=60.0)          # stop listening, finish what is in flight

    async def handler(request: Request) -> Response | Stream:
        request.method, request.path        # bytes; the path without its query (request.target: with it)
        request.header(b"authorization")    # bytes or None (lower-case name)
        await request.body()                # bytes; TooLarge / Incomplete (BodyError)
        return Response(200, JSON, b"{}")   # sent whole, in one write
        # or: stream = request.stream(200, headers, length=None); await stream.write(b"..");
        #     stream.end(); return stream

    def begin(request: Request) -> bool:   # optional: answer a complete request without a task
        ...; request.on_lost = cleanup      # called if the client leaves before the answer
        request.answer(Response(...))       # later, from a protocol callback: sent at once
        # or: request.resume(coro)          # the rest in a task, as if `handler` returned coro's answer
        return True                         # False: the handler answers it in a task, as usual

A task per request (its creation and scheduling, the loop's weak set of all
tasks, the futures it waits on) is a large part of the CPU a small proxied
exchange costs, hence `begin`: it is offered each request whose body is
complete, and may answer it from callbacks. Requests on one connection are answered one at a time, in order: pipelined
requests are parsed as they arrive and wait their turn (reading pauses while
MAX_QUEUED wait). A request's body is read as it arrives, up to `max_body`;
`Expect: 100-continue` is answered when the handler asks for the body.
Malformed input is answered 400 (a head over MAX_HEAD 431) after the requests
before it, then the connection closes; so is a request line that is not HTTP/1.x,
HTTP/0.9's as soon as it ends. A chunk that would take the body over `max_body`
is answered 413 as soon as its size line is read. For these two the input is cut
where a head and a chunk-size line end before the parser has it (a body is fed
whole: HttpConn._feed). A client that disconnects cancels the
handler of its request (which closes the engine's connection: the engine stops
generating).

What a client may hold of the server is bounded by `Limits`: a request's line and
headers must arrive within `header_timeout` of its first byte (a new connection's
first request: of the accept), a body within `body_timeout` plus a second per
`body_min_rate` bytes received, an idle keep-alive connection closes after
`keepalive` seconds, and one address may hold `max_conns_per_addr` connections.
A late head or body is answered 408 and the connection closes; a connection
over the cap is answered 429 and closed. The timeouts cost the common exchange
no timer: each connection has one timer, which looks at the connection at most
a tick (the shortest timeout) apart; the parser's callbacks only note which part
of a request is awaited and since when.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import socket
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, cast

import httptools

from llmgw.gateway import errors
from llmgw.gateway.response import Response, date_line, status_line, write_message

log = logging.getLogger(__name__)

MAX_HEAD = 64 * 1024  # request line and headers
MAX_HEADERS = 128
MAX_QUEUED = 16  # parsed requests waiting on one connection before reading pauses
LINGER = 10.0  # seconds input is still read (and dropped) after a final answer, so it arrives whole
_CLOSE = b"Connection: close\r\n"
_LINE_END = len(b" HTTP/1.1\r")  # what ends a request line with a version
MAX_CHUNK_LINE = 4096  # of a chunk's size line, the start kept to read the size (extensions may follow it)
_KEEP_ALIVE = b"Connection: keep-alive\r\n"  # only needed for HTTP/1.0 clients

# What a connection awaits from its client, hence which timeout applies (HttpConn._phase).
_FIRST = 0  # the first byte of its first request: header_timeout from the accept
_HEAD = 1  # the rest of a request's line and headers: header_timeout from its first byte
_BODY = 2  # a request's body: body_timeout plus a second per body_min_rate bytes, from the end of the head
_IDLE = 3  # the next request on a keep-alive connection: keepalive from the end of the last answer
_NOTHING = 4  # an answer is under way, or no more input is read: no timeout


@dataclass(frozen=True)
class Limits:
    """What one client may hold of the server; the gateway's flags set them (see docs/gateway.md)."""

    header_timeout: float = 10.0  # seconds for a request's line and headers
    keepalive: float = 3630.0  # seconds idle between requests: longer than load balancers keep theirs
    body_timeout: float = 60.0  # seconds for a body, plus a second per body_min_rate bytes received
    body_min_rate: int = 1024  # bytes/s; 0: the whole body within body_timeout
    max_conns_per_addr: int = 256  # open connections from one client address; 0: no cap

    def __post_init__(self) -> None:
        if min(self.header_timeout, self.keepalive, self.body_timeout) <= 0:
            raise ValueError("the timeouts must be positive")
        if self.body_min_rate < 0 or self.max_conns_per_addr < 0:
            raise ValueError("body_min_rate and max_conns_per_addr must be 0 or more")


class BodyError(Exception):
    """Why a request's body cannot be had; the message is for the client."""


class TooLarge(BodyError):
    """The body is over the server's max_body."""


class Incomplete(BodyError):
    """The client stopped sending before the end of the body."""


class Malformed(BodyError):
    """The body's framing cannot be parsed (e.g. a chunk size that is not hexadecimal)."""


class TimedOut(BodyError):
    """The body did not arrive within the server's body timeout."""


class _HeadTooLarge(Exception):
    pass


class _NotHttp1(Exception):
    """A request line of another version than HTTP/1.x (HTTP/0.9's has none): 400, then close."""

    def __init__(self, version: str) -> None:
        super().__init__(f"HTTP/{version} is not spoken here: send HTTP/1.1 (or 1.0)")


class Request:
    __slots__ = ("method", "path", "target", "headers", "keep_alive", "http10", "complete", "too_large", "failed",
                 "canned", "on_lost", "on_eof", "traceparent", "received", "priority", "ticket", "_conn",
                 "_chunks", "_size", "_continue", "_waiter")

    def __init__(self, conn: "HttpConn", method: bytes, path: bytes, headers: list[tuple[bytes, bytes]],
                 keep_alive: bool, http10: bool):
        self._conn = conn
        self.method, self.path, self.headers = method, path, headers
        self.target = path   # the request target as sent on: the path and its query
        self.keep_alive, self.http10 = keep_alive, http10
        self.complete = False
        self.too_large = False
        self.failed: BodyError | None = None  # the body will not come whole: why
        self.canned: Response | None = None  # the answer to input that could not be parsed
        # begin's cleanup, called if the client leaves before the answer
        self.on_lost: Callable[[], None] | None = None
        # called if the client hangs up (its FIN) while this request is being answered: the connection
        # stays open to answer it, so a handler that is only waiting (queue.py) gives up its place
        self.on_eof: Callable[[], None] | None = None
        # the W3C traceparent the handler sends on with this request, once made (its trace id is in its logs)
        self.traceparent: bytes | None = None
        self.received = time.perf_counter()  # its head's arrival: where its time to first token starts
        # its priority class (queue.py: critical, standard, sheddable), set by whoever admits it
        self.priority = "standard"
        # what admitted it (admission.py's Ticket), released once it is answered
        self.ticket: Any = None
        self._chunks: list[bytes] = []
        self._size = 0
        self._continue = False  # the client waits for "100 Continue" before sending the body
        self._waiter: asyncio.Future[None] | None = None

    @property
    def client_gone(self) -> bool:
        return self._conn.lost or self._conn.transport.is_closing()

    def header(self, lname: bytes) -> bytes | None:
        """The first value of a header, by its lower-case name."""
        for k, v in self.headers:
            if k.lower() == lname:
                return v
        return None

    async def body(self) -> bytes:
        if not self.complete and not self.too_large:
            if self._continue:
                self._continue = False
                conn = self._conn
                conn.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                if conn._cur is self:
                    conn._since = time.monotonic()  # the body's time starts when it is asked for
            while not (self.complete or self.too_large or self.failed):
                self._waiter = fut = asyncio.get_running_loop().create_future()
                try:
                    await fut
                finally:
                    self._waiter = None
        if self.too_large:
            raise TooLarge()
        if self.failed is not None:
            raise self.failed
        body = self.body_at_hand()
        assert body is not None  # complete, and within the limit
        return body

    def body_at_hand(self) -> bytes | None:
        """The whole body if it has been received (and is within the limit), else None."""
        if not self.complete or self.too_large:
            return None
        chunks = self._chunks
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def abort(self) -> None:
        """Close the client's connection: the request must not go on (its API key was revoked)."""
        self._conn.transport.close()

    def answer(self, resp: Response) -> None:
        """Send the answer to a request `begin` took, now."""
        self._conn.answered_now(self, resp)

    def resume(self, coro: Answering) -> None:
        """Answer a request `begin` took with what `coro` returns, in a task."""
        self._conn.resume(coro)

    def stream(self, status: int, headers: bytes, length: int | None = None) -> "Stream":
        """Send the head of a response whose body follows in pieces (chunked when `length` is None)."""
        return Stream(self, status, headers, length)

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)


class Stream:
    """A response sent in pieces, with flow control: write() waits while the client lags."""

    __slots__ = ("_conn", "status", "chunked", "ended")

    def __init__(self, request: Request, status: int, headers: bytes, length: int | None):
        conn = self._conn = request._conn
        self.status = status
        # HTTP/1.0 has no chunked encoding: a body of unknown length ends with the connection.
        self.chunked = length is None and not request.http10
        self.ended = False
        conn.stream = self
        if length is not None:
            framing = b"Content-Length: %d\r\n" % length
        elif self.chunked:
            framing = b"Transfer-Encoding: chunked\r\n"
        else:
            framing = b""
            conn.closing = True
        conn.transport.write(conn.head(request, status, headers + framing))

    async def write(self, data: bytes) -> None:
        conn = self._conn
        if conn.lost or conn.transport.is_closing():
            raise ConnectionResetError("the client closed the connection")
        if self.chunked:
            conn.transport.write(b"%x\r\n%s\r\n" % (len(data), data))
        else:
            conn.transport.write(data)
        if conn.write_paused:
            await conn.drained()

    def end(self) -> None:
        self.ended = True
        if self.chunked and not self._conn.transport.is_closing():
            self._conn.transport.write(b"0\r\n\r\n")

    def abort(self) -> None:
        """Cut the response short: the client sees the connection close before the end of the body."""
        self.ended = True
        self._conn.transport.close()


Answering = Coroutine[Any, Any, Response | Stream]  # what resume takes: a handler's answer, to come
Handler = Callable[[Request], Answering]  # answers a request (a task runs it)


class HttpConn(asyncio.Protocol):
    """One client connection."""

    transport: asyncio.Transport  # set by connection_made, the first event

    def __init__(self, server: "HttpServer"):
        self.server = server
        self.parser = httptools.HttpRequestParser(self)
        self.queue: collections.deque[Request] = collections.deque()  # parsed; the first is being answered
        self.task: asyncio.Task[None] | None = None  # answers the head of the queue
        self.begun: Request | None = None  # the head of the queue, taken by the server's begin
        self._resume: Answering | None = None  # the coroutine the next task answers with, in place of the handler
        self.closing = False  # close after the answer in progress
        self.no_more = False  # no request will follow those queued (the client's EOF, bad input): close after them
        self.lost = False
        self.stream: Stream | None = None  # the streamed answer to the request in progress, if any
        self.write_paused = False
        self._phase = _FIRST  # what is awaited from the client (the timeout that applies)...
        self._since = time.monotonic()  # ...since when
        self._timer: asyncio.TimerHandle | None = None  # the connection's one timer (_check)
        self._addr: str | None = None  # the client's address, where connections per address are counted
        self._stalled = False  # a timeout expired: close right after the answer
        self._read_paused = False
        self._client_eof = False
        self._discard = False  # input is no longer parsed, only dropped
        self._drain: asyncio.Future[None] | None = None
        self._cur: Request | None = None  # the request whose body is being parsed
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._head_size = 0
        # How input is cut before the parser has it (_feed): a head is fed up to its end, so that
        # on_headers_complete may start a chunked body before its bytes are parsed; a chunk's size
        # line alone, so that on_chunk_header knows the line it follows (httptools does not pass
        # the chunk's size); a chunk's data, or a Content-Length body, whole.
        self._head_tail = b""  # the last bytes of a head not yet ended (its end may begin there)
        self._line_ended = False  # ...whose request line has ended (with a version)
        self._chunked = False  # in a chunked body
        self._line = b""  # the chunk-size line (its start) fed last
        self._line_tail = b""  # the start of a size line not yet ended
        self._whole = 0  # bytes to come that are fed whole: a chunk's data and CRLF, or a body

    # ------------------------------------------------------------ transport events

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream's transport (uvloop's TCPTransport is one, without being a subclass)
        self.transport = cast(asyncio.Transport, transport)
        server = self.server
        server.conns.add(self)
        self._timer = asyncio.get_running_loop().call_later(server.tick, self._check)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)  # find dead peers
            except OSError:
                pass
        if server.closing:
            self.shutdown()
            return
        cap = server.limits.max_conns_per_addr
        if cap:
            peer = transport.get_extra_info("peername")
            if peer:
                addr = self._addr = peer[0]
                n = server.per_addr[addr] = server.per_addr.get(addr, 0) + 1
                if n > cap:
                    self._turn_away(cap)

    def data_received(self, data: bytes) -> None:
        if self._discard:
            return
        try:
            self._feed(data)
        except httptools.HttpParserUpgrade:
            # No protocol switching here: answer the request as a plain one, then close.
            self._stop_reading()
        except _NotHttp1 as err:  # a request line without a version (_feed)
            self._refuse(errors.bad_request(str(err)))
        except httptools.HttpParserCallbackError as err:
            if isinstance(err.__context__, _NotHttp1):
                self._refuse(errors.bad_request(str(err.__context__)))
            elif isinstance(err.__context__, _HeadTooLarge):
                self._refuse(errors.headers_too_large(MAX_HEAD))
            else:
                raise
        except httptools.HttpParserError as err:
            message = f"Malformed HTTP request: {err}"
            if self._cur is not None:  # in a body (a bad chunk size): its request is answered 400
                self._fail_body(Malformed(message))
            else:
                self._refuse(errors.bad_request(message))
        self._dispatch()

    def _feed(self, data: bytes) -> None:
        """Parse `data`, cut where the parser's callbacks need it (see _whole); a segment is cut
        into few pieces, each a slice of it, not a copy."""
        feed = self.parser.feed_data
        view = memoryview(data)
        pos, end = 0, len(data)
        while pos < end:
            if self._whole:
                stop = min(end, pos + self._whole)
                self._whole -= stop - pos
            elif self._chunked:  # a size line, or a trailer after the last chunk
                nl = data.find(b"\n", pos)
                stop = end if nl < 0 else nl + 1
                self._line = (self._line_tail + data[pos:min(stop, pos + MAX_CHUNK_LINE)])[:MAX_CHUNK_LINE]
                self._line_tail = b"" if nl >= 0 else self._line
            else:  # a head (llhttp ends one with CRLF CRLF only), or between requests
                tail = self._head_tail
                at = (tail[-3:] + data[pos:pos + 3]).find(b"\r\n\r\n") if tail else -1  # across segments
                if at >= 0:
                    stop = pos + at + 4 - len(tail[-3:])
                else:
                    at = data.find(b"\r\n\r\n", pos)
                    stop = end if at < 0 else at + 4
                if at >= 0:
                    self._head_tail, self._line_ended = b"", False
                else:  # the head goes on in a later segment
                    if not self._line_ended:
                        self._check_request_line(tail + data[pos:end])
                    self._head_tail = (tail + data[pos:end])[-_LINE_END:]
            feed(view[pos:stop])
            pos = stop

    def _check_request_line(self, head: bytes) -> None:
        """`head`: a head not ended yet, as far as it came (or its last bytes before this segment,
        then the segment). A request line without a version, HTTP/0.9's, is refused as soon as
        it ends: its client sends nothing more (llhttp would wait for headers, then time out)."""
        line, nl, _ = head.lstrip(b"\r\n").partition(b"\n")  # (blank lines may come before a request)
        if nl:
            if not line[-_LINE_END:].startswith(b" HTTP/"):  # " HTTP/1.1\r" ends a line with a version
                raise _NotHttp1("0.9")
            self._line_ended = True

    def eof_received(self) -> bool:
        if self._cur is not None:  # the client stopped sending in the middle of a body
            self._fail_body(Incomplete("The client stopped sending before the end of the request body"))
        self._client_eof = True
        self._stop_reading()
        if self.queue and self.queue[0].on_eof is not None:
            self.queue[0].on_eof()
        return self.busy  # keep the transport open to answer what is queued

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        server = self.server
        server.conns.discard(self)
        if self._timer is not None:
            self._timer.cancel()
        addr = self._addr
        if addr is not None:
            n = server.per_addr[addr] - 1
            if n:
                server.per_addr[addr] = n
            else:
                del server.per_addr[addr]
        if self.task is not None:
            self.task.cancel()  # the caller left: stop working for it
            if self._resume is not None:  # the task had not started
                self._resume.close()
                self._resume = None
        begun = self.begun
        if begun is not None:
            self.begun = None
            if begun.on_lost is not None:
                begun.on_lost()
        d = self._drain
        if d is not None and not d.done():
            d.set_result(None)

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        d = self._drain
        if d is not None and not d.done():
            d.set_result(None)

    async def drained(self) -> None:
        while self.write_paused and not self.lost:
            self._drain = asyncio.get_running_loop().create_future()
            await self._drain
        self._drain = None

    # ------------------------------------------------------------ httptools callbacks

    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = []
        self._head_size = 0
        if self._phase != _FIRST:  # a new connection's first head is timed from the accept
            self._since = time.monotonic()
        self._phase = _HEAD

    def on_url(self, url: bytes) -> None:  # may come in pieces
        self._url += url
        self._grow(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))
        self._grow(len(name) + len(value) + 4)
        if len(self._headers) > MAX_HEADERS:
            raise _HeadTooLarge()

    def on_headers_complete(self) -> None:
        p = self.parser
        url = self._url
        if url[:1] != b"/":  # absolute form (http://host/path); anything else matches no route
            try:
                url = httptools.parse_url(url).path or b"/"
            except httptools.HttpParserInvalidURLError:
                pass
        version = p.get_http_version()
        if version not in ("1.1", "1.0"):
            raise _NotHttp1(version)
        path = url.partition(b"?")[0]
        req = Request(self, p.get_method(), path, self._headers, p.should_keep_alive(), version == "1.0")
        req.target = url
        for k, v in self._headers:
            lk = k.lower()
            if lk == b"content-length":
                try:
                    self._whole = int(v)  # the body, fed whole
                except ValueError:
                    pass  # llhttp refuses a malformed Content-Length before this
                req.too_large = self._whole > self.server.max_body
            elif lk == b"expect" and v.lower() == b"100-continue" and not req.http10:
                req._continue = True
            elif lk == b"transfer-encoding" and v.lower().endswith(b"chunked"):
                self._chunked = True
                self._line_tail = b""
        self._cur = req
        self._phase = _BODY
        self._since = time.monotonic()
        self._enqueue(req)

    def on_body(self, body: bytes) -> None:
        req = self._cur
        assert req is not None  # between on_headers_complete and on_message_complete
        if req.too_large:
            return
        req._size += len(body)
        if req._size > self.server.max_body:
            req.too_large = True
            req._chunks = []
            req._wake()
        else:
            req._chunks.append(body)

    def on_chunk_header(self) -> None:
        """A chunk's size line was read: a chunk that would take the body over the limit is refused
        now (413), not after its bytes, which may never come."""
        line, self._line = self._line, b""  # read once: a line not known is never read again
        try:
            size = int(line.partition(b";")[0].strip(), 16)
        except ValueError:  # llhttp refuses a size that is not hexadecimal: the line was not known
            self._whole = 0  # so the next one is cut where it ends, to be known
            return
        self._whole = size + 2 if size else 0  # the data and its CRLF; after the last chunk, trailers
        req = self._cur
        if req is None or req.too_large:
            return
        if req._size + size > self.server.max_body:
            req.too_large = True
            req._chunks = []
            req._wake()

    def on_message_complete(self) -> None:
        req = self._cur
        assert req is not None  # after on_headers_complete
        self._cur = None
        self._chunked = False
        self._phase = _NOTHING
        req.complete = True
        req._wake()

    # ------------------------------------------------------------ answering

    def _grow(self, n: int) -> None:
        self._head_size += n
        if self._head_size > MAX_HEAD:
            raise _HeadTooLarge()

    def _refuse(self, answer: Response) -> None:
        """Input that cannot be parsed: answer it after the requests before it, then close."""
        req = Request(self, b"", b"", [], False, False)
        req.complete = True
        req.canned = answer
        self._stop_reading()
        self._enqueue(req)

    def _fail_body(self, why: BodyError) -> None:
        """The body being received will not come whole: its request is answered (the handler
        gets `why` from body()), then the connection closes."""
        cur = self._cur
        assert cur is not None  # in a body
        cur.failed = why
        self._stop_reading()
        cur._wake()

    def _stop_reading(self) -> None:
        """No request follows those queued: what arrives is dropped, and no timeout applies."""
        self.no_more = self._discard = True
        self._phase = _NOTHING

    def _turn_away(self, cap: int) -> None:
        """Over the cap of connections from one address: a 429 at once, then close."""
        self._stop_reading()
        self._send(Request(self, b"", b"", [], False, False), errors.too_many_connections(cap))
        self._close()

    # ------------------------------------------------------------ timeouts

    def _deadline(self) -> float | None:
        """When what the connection awaits from its client is late (monotonic time), or None."""
        if self._read_paused:
            return None  # not the client's delay: we stopped reading (too many requests queued)
        phase = self._phase
        limits = self.server.limits
        if phase == _HEAD or phase == _FIRST:
            return self._since + limits.header_timeout
        if phase == _IDLE:
            return self._since + limits.keepalive
        if phase == _BODY:
            cur = self._cur
            assert cur is not None  # in a body
            if cur._continue and not cur._size:
                return None  # not the client's delay: it waits for our "100 Continue"
            return self._since + limits.body_timeout + cur._size * self.server.per_byte
        return None

    def _check(self) -> None:
        """The connection's timer: act on a timeout that has expired, then look again at the
        deadline or in a tick, whichever comes first. Every timeout is at least a tick, so a
        deadline set between two looks (by a callback, which only notes the phase and its
        start) never falls before the next look."""
        if self.lost:
            return
        now = time.monotonic()
        deadline = self._deadline()
        if deadline is not None and now >= deadline:
            self._expire()
            deadline = None
        tick = self.server.tick
        delay = tick if deadline is None else min(tick, deadline - now)
        self._timer = asyncio.get_running_loop().call_later(delay, self._check)

    def _expire(self) -> None:
        phase = self._phase
        if phase == _FIRST or phase == _IDLE:  # no request begun: close without a word
            self._phase = _NOTHING
            self.transport.close()
            return
        self._stalled = True
        limits = self.server.limits
        if phase == _HEAD:
            self._refuse(errors.request_timeout(
                f"The request's line and headers did not arrive within {limits.header_timeout:g} s"))
            self._dispatch()
        else:
            rate = f", plus a second per {limits.body_min_rate} bytes received" if limits.body_min_rate else ""
            self._fail_body(TimedOut(f"The request body did not arrive within {limits.body_timeout:g} s{rate}"))

    def _enqueue(self, req: Request) -> None:
        self.queue.append(req)
        if len(self.queue) > MAX_QUEUED and not self._read_paused:
            self._read_paused = True
            self.transport.pause_reading()

    @property
    def busy(self) -> bool:
        return self.task is not None or self.begun is not None

    def _dispatch(self) -> None:
        """Start answering the head of the queue unless that is under way: by `begin` if it
        takes it (the body is complete), else in a task (the handler reads the body as it comes)."""
        if self.busy or not self.queue or self.lost:
            return
        req = self.queue[0]
        begin = self.server.begin
        if begin is not None and req.canned is None and req.complete:
            self.begun = req
            if begin(req):
                return
            self.begun = None
        self.task = asyncio.get_running_loop().create_task(self._serve(req))

    def answered_now(self, req: Request, resp: Response) -> None:
        assert self.begun is req
        self.begun = None
        if not self.transport.is_closing():
            self._send(req, resp)
        self._answered()

    def resume(self, coro: Answering) -> None:
        req, self.begun = self.begun, None
        assert req is not None  # begin took it
        self._resume = coro
        self.task = asyncio.get_running_loop().create_task(self._serve(req))

    def head(self, req: Request, status: int, headers: bytes) -> bytes:
        """The head of the answer to `req`, its framing among `headers`; marks the connection
        closing if it must close after this answer."""
        if not req.keep_alive or not req.complete or self.closing:
            # Not complete: the rest of its body was never read, so the next request cannot be found.
            self.closing = True
            connection = _CLOSE
        else:
            connection = _KEEP_ALIVE if req.http10 else b""
        return b"%s%s%s%s\r\n" % (status_line(status), date_line(), headers, connection)

    async def _serve(self, req: Request) -> None:
        """Answer `req`, the head of the queue: with the handler's answer, or that of the
        coroutine `resume` was given."""
        resume, self._resume = self._resume, None
        try:
            if req.canned is not None:
                self._send(req, req.canned)
            else:
                self.stream = None
                try:
                    resp = await (resume if resume is not None else self.server.handler(req))
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("gateway error on %s %s", req.method.decode(), req.path.decode("latin-1"))
                    resp = errors.internal_error()
                stream = self.stream
                if stream is not None:
                    if not stream.ended:  # the handler failed part-way through its answer
                        stream.abort()
                elif not self.transport.is_closing():
                    assert isinstance(resp, Response)  # a Stream sets self.stream
                    self._send(req, resp)
        finally:
            self.task = None
        self._answered()

    def _answered(self) -> None:
        """The head of the queue has its answer: go on with the next request, or close."""
        self.queue.popleft()
        if not self.queue and self._phase == _NOTHING and not self._discard:
            self._phase = _IDLE  # the keep-alive timeout runs from here
            self._since = time.monotonic()
        if self.lost:
            return
        if self.closing or self.transport.is_closing() or (self.no_more and not self.queue):
            self._close()
            return
        if self._read_paused and len(self.queue) <= MAX_QUEUED // 2:
            self._read_paused = False
            self._since = time.monotonic()  # the time reading was paused was ours, not the client's
            self.transport.resume_reading()
        self._dispatch()

    def _send(self, req: Request, resp: Response) -> None:
        body = resp.body
        head = self.head(req, resp.status, b"%sContent-Length: %d\r\n" % (resp.headers, len(body)))
        if req.method == b"HEAD":
            self.transport.write(head)
        else:
            write_message(self.transport, head, body)

    def _close(self) -> None:
        """Close after the last answer; input still arriving is read and dropped a while so that
        the client, still sending, gets the answer rather than a reset."""
        t = self.transport
        if t.is_closing():
            return
        # A client that stalled gets no time to send more; nor does one that sent all it had.
        if self._client_eof or self._stalled or (self._cur is None and not self._discard):
            t.close()
            return
        self._stop_reading()
        if t.can_write_eof():
            t.write_eof()
        asyncio.get_running_loop().call_later(LINGER, t.close)

    def shutdown(self) -> None:
        """The server is stopping: close now if idle, else after the answer in progress."""
        self.closing = True
        if not self.busy:
            self.transport.close()


class HttpServer:
    def __init__(self, handler: Handler, max_body: int, limits: Limits = Limits(),
                 begin: Callable[[Request], bool] | None = None) -> None:
        self.handler = handler
        self.begin = begin
        self.max_body = max_body
        self.limits = limits
        self.tick = min(limits.header_timeout, limits.keepalive, limits.body_timeout)
        self.per_byte = 1 / limits.body_min_rate if limits.body_min_rate else 0.0  # body time allowed per byte
        self.conns: set[HttpConn] = set()
        self.per_addr: dict[str, int] = {}  # open connections by client address (with a cap)
        self.closing = False
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int, backlog: int = 1024) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: HttpConn(self), host, port, backlog=backlog,
                                                reuse_address=True)

    @property
    def port(self) -> int:
        assert self._server is not None  # started
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def close(self, grace: float = 60.0) -> None:
        """Stop accepting; idle connections close now, busy ones after their answer (at most `grace` s)."""
        self.closing = True
        assert self._server is not None  # started
        self._server.close()
        for conn in list(self.conns):
            conn.shutdown()
        deadline = time.monotonic() + grace
        while self.conns and time.monotonic() < deadline:  # noqa: ASYNC110 connections close on their own
            await asyncio.sleep(0.05)
        for conn in list(self.conns):
            conn.transport.abort()
        await asyncio.sleep(0)  # let connection_lost run
