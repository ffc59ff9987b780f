"""Forwarding a request that has passed the chain (chain.py) to a Ready replica: retries, relaying.

A lean keep-alive pool (upstream.py, httptools' parser) talks to the engines. A request goes to
the replica its model's policy picks (the fewest outstanding requests, or cache-aware: balancer.py;
the policies in llmgw/routing/). A connection failure before the engine's first byte (refused,
reset, disconnected before the headers, no headers within the response timeout) or a 503 from
the engine is retried once on another replica; a replica that keeps failing so is left out of
routing for a while (outlier.py). A try still waiting for its headers on a replica that leaves
routing (not Ready, Failed, deleted, ejected) is failed at once (`abandon`, reason "gone") and
retried the same way, never on that replica again; so is a 404 from an engine asked for a LoRA
adapter (it unloaded the adapter as the gateway routed to it: the Adapter's status no longer
says it is resident there, and this gateway has not seen that yet), and with no other replica
holding it (the replica leaves the adapter's routing at once: table.unloaded) the request waits
in the adapter's queue again (`requeue`), once; a response under way on a replica whose
engine is known dead (Failed, deleted) ends as one cut off does. Server-sent events are relayed
chunk by chunk as they arrive, never buffered. A Responses API call pinned to the replica that
holds its previous response (steps/endpoint.py) goes there only; the response ids a Responses
API answer carries are rewritten to name the replica that made them (responses.py), in a stream
line by line.

The common case (an idle connection to the replica picked, a small response with a length) is
answered from protocol callbacks, without a task or a coroutine (`Proxy.begin`, `Exchange`);
whatever else happens on the way (a retry, a stream, a failure) continues in a task, on the same
path as a request forwarded from one.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Collection

from llmgw.gateway import errors, trace
from llmgw.gateway.balancer import Balancer
from llmgw.gateway.endpoints import RESPONSES, ROUTED
from llmgw.gateway.http1 import Request, Stream
from llmgw.gateway.metrics import Metrics
from llmgw.gateway.outlier import Outliers
from llmgw.gateway.response import Response
from llmgw.gateway.responses import Relabel
from llmgw.gateway.spans import Spans
from llmgw.gateway.step import Call
from llmgw.gateway.table import Backend, RoutingTable
from llmgw.gateway.upstream import CONNECT_TIMED_OUT, Conn, Pool, UpstreamError
from llmgw.routing.prefix import SESSION_HEADER

log = logging.getLogger(__name__)

REPLICA_HEADER = "X-Llmgw-Replica"  # which replica answered, on every proxied response
_REPLICA_LINE = REPLICA_HEADER.encode() + b": "
# Responses up to this size with a Content-Length are read whole and sent in one write.
_BUFFER_LIMIT = 1 << 20

_HOP = frozenset({
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailer",
    b"transfer-encoding", b"upgrade", b"host", b"content-length",
})
# The gateway's key is not the engine's business; the body is sent at once, so no Expect.
_DROP_REQ = _HOP | {b"authorization", b"expect", trace.HEADER}
_DROP_RESP = _HOP | {b"server", b"date"}

_ENGINE_503 = "unavailable: the engine answered 503 (loading or draining)"
GONE = "gone: "   # the reason's start for a try failed because its replica left routing
_ADAPTER_GONE = GONE + "the engine answered 404: it no longer holds the adapter"


class _Retry(Exception):
    def __init__(self, reason: str):
        self.reason = reason


class Proxy:
    """Sends calls on to the replicas of their models and relays the answers; `hand_over(exchange)`
    goes on in a task with an exchange begun without one (`go_on`)."""

    def __init__(self, table: RoutingTable, balancer: Balancer, outliers: Outliers, metrics: Metrics, pool: Pool,
                 spans: Spans | None, retry_after: int, hand_over: Callable[[Exchange], None],
                 requeue: Callable[[Call], Awaitable[Response | None]]) -> None:
        """`requeue(call)`: the call waits in its model's queue again (None once a replica may take
        it; else the queue's refusal)."""
        self.table, self.balancer, self.outliers, self.metrics, self.pool = table, balancer, outliers, metrics, pool
        self.spans = spans   # OpenTelemetry export, when --otel asks for it
        self.retry_after = retry_after
        self.hand_over = hand_over
        self.requeue = requeue

    def finished(self, call: Call, code: int) -> None:
        """A proxied request answered: its key's ticket let go, its metrics, and its span if
        spans are exported."""
        request = call.request
        ticket = request.ticket
        if ticket is not None:
            request.ticket = None
            ticket.release()
        model = call.model or "-"   # "-": no model was resolved
        seconds = time.perf_counter() - call.start
        self.metrics.observe(model, code, seconds)
        if self.spans is not None:
            self.spans.request(request.path, request.traceparent, request.header(trace.HEADER), model, code, seconds)

    def begin(self, call: Call) -> bool:
        """Send the call to the replica picked, without a task (an `Exchange`); False if none is
        picked now."""
        b = self._pick(call, self.table.backends_for(call.model))
        if b is None:
            return False
        Exchange(self, call, b, self.pool.idle(b.endpoint))
        return True

    async def go_on(self, ex: Exchange) -> Response | Stream:
        """The rest of an exchange begin started, in a task: its answer, or a retry elsewhere."""
        call = ex.call
        try:
            if ex.conn is None:  # no idle connection to the replica picked: connect first
                return await self._attempt(call, ex.backend, call.body.for_backend(ex.backend, call.name),
                                           _fields(call.request), False)
            return await self._answer(call, ex.backend, ex.conn)
        except _Retry as r:
            return await self.forward(call, failed=(ex.backend, r.reason))

    async def forward(self, call: Call, failed: tuple[Backend, str] | None = None,
                      requeued: bool = False) -> Response | Stream:
        """Try a replica, and on a failure before its first byte one more; `failed`: the first
        try has been made (by begin) and failed, for this reason. An adapter no replica holds any
        more (its engine's 404, or none routed as the request left its queue) goes back to its
        queue, once (`requeued`)."""
        request, body, name, model = call.request, call.body, call.name, call.model
        backends = self.table.backends_for(model)
        if not backends and failed is None:
            if not requeued and self.table.base(model) != model:   # an adapter unloaded as it left its queue
                refused = await self.requeue(call)
                return refused if refused is not None else await self.forward(call, requeued=True)
            return errors.no_replica(model, self.retry_after)
        fields = _fields(request)
        tried: list[str] = []
        last = "no replica"
        gone = False   # the failed try's replica left routing: never tried again
        b: Backend | None
        if failed is not None:
            b, reason = failed
            last = self._failed(request, model, b, reason, retrying=True)
            tried.append(b.replica)
            gone = reason.startswith(GONE)
        for attempt in (1,) if failed is not None else (0, 1):
            b = self._pick(call, self.table.backends_for(model) if attempt else backends, tried)
            fresh = False
            if b is None and attempt and not gone:
                # No other replica: one more try on the same one, on a fresh connection.
                b = self._pick(call, self.table.backends_for(model))
                fresh = True
            if b is None:
                break
            if attempt:
                self.metrics.retry(model)
            try:
                return await self._attempt(call, b, body.for_backend(b, name), fields, fresh)
            except _Retry as r:
                last = self._failed(request, model, b, r.reason, retrying=attempt == 0)
                tried.append(b.replica)
                gone = r.reason.startswith(GONE)
        if last.endswith(_ADAPTER_GONE) and not requeued and not self.table.backends_for(model):
            refused = await self.requeue(call)
            return refused if refused is not None else await self.forward(call, requeued=True)
        if not self.table.backends_for(model) or last.endswith(_ENGINE_503):
            return errors.no_replica(model, self.retry_after)
        return errors.bad_gateway(f"No replica of model '{model}' answered: {last}")

    def _pick(self, call: Call, backends: list[Backend], exclude: Collection[str] = ()) -> Backend | None:
        """The replica for this call by its model's policy (or the one it is pinned to); the key
        is made once per request."""
        if call.pinned is not None:
            b = self.table.backends.get(call.pinned)
            return b if b is not None and b.replica not in exclude else None
        body = call.body
        policy = self.balancer.policy(call.model, self.table.routing(call.model), self.table.base(call.model))
        if body.key is None or body.key[0] is not policy:  # (a retry may find the Model changed)
            body.key = (policy, policy.key(body.doc, call.request.header(SESSION_HEADER)))
        if self.outliers.ejections:
            exclude = self.outliers.excluded((b.replica for b in backends), exclude)
        b = policy.pick(backends, self.balancer.inflight, body.key[1], exclude)
        if b is not None:
            body.predicted = policy.predicted(body.key[1], b.replica)
        return b

    def _failed(self, request: Request, model: str, b: Backend, reason: str, retrying: bool) -> str:
        """Count and log a try that failed before the engine's first byte; what to tell the caller."""
        last = f"{b.replica} ({b.endpoint}): {reason}"
        if reason == _ADAPTER_GONE:   # the engine's word, before the Adapter's status reaches this gateway
            self.table.unloaded(model, b.replica)
        if reason != _ENGINE_503 and not reason.startswith(GONE):   # not the engine's failure: no outlier
            self.outliers.failed(b.replica, b.endpoint, at_once=reason.startswith(CONNECT_TIMED_OUT))
        self.metrics.upstream_error(model, b.replica, reason.split(":")[0])
        tid = _trace_id(request)
        log.info("upstream %s failed before its first byte; %s (trace %s)", last,
                 "retrying" if retrying else "giving up", tid, extra={"trace_id": tid, "model": model})
        return last

    async def _attempt(self, call: Call, b: Backend, data: bytes, fields: bytes,
                       fresh: bool) -> Response | Stream:
        self.balancer.acquire(b)
        conn = None
        try:
            conn = await self.pool.acquire(b.endpoint, fresh)
            _send(conn, call.request, b, data, fields)
        except BaseException as err:
            if conn is not None:
                self.pool.release(conn)
            self.balancer.release(b)
            if isinstance(err, UpstreamError):
                raise _Retry(err.reason) from None
            raise
        return await self._answer(call, b, conn)

    async def _answer(self, call: Call, b: Backend, conn: Conn) -> Response | Stream:
        """The engine's answer to the request sent on `conn`; ends the hold on `b` and `conn`."""
        try:
            try:
                await conn.headers_done()
            except UpstreamError as err:
                raise _Retry(err.reason) from None
            return await self._relay(call, conn, b)
        finally:
            self.pool.release(conn)  # reused only if its response was read to the end
            self.balancer.release(b)

    async def _relay(self, call: Call, conn: Conn, b: Backend) -> Response | Stream:
        request = call.request
        if _retried(conn.status, b):
            raise _Retry(_ENGINE_503 if conn.status == 503 else _ADAPTER_GONE)
        self._answered(b)
        headers, length, sse = _response_head(conn, b)
        if _buffered(length, sse):
            try:
                data = await conn.read_all()
            except UpstreamError as err:
                raise _Retry(err.reason) from None  # nothing sent to the client yet
            if conn.status == 200:
                data = self._made(call, b, data)
            return Response(conn.status, headers, data)
        # a Responses answer's ids are rewritten (its length changes: sent chunked)
        relabel = Relabel(b.replica) if conn.status == 200 and request.path.startswith(RESPONSES) else None
        resp = request.stream(conn.status, headers, None if sse or relabel is not None else length)
        timer = (self.metrics.stream(b.model, request.received, call.body.predicted)
                 if sse and conn.status == 200 else None)
        try:
            while True:
                chunk = await conn.read_chunk()
                if not chunk:
                    break
                if timer is not None:
                    timer.chunk(chunk)
                if relabel is not None:
                    chunk = relabel.chunk(chunk)
                    if not chunk:
                        continue
                await resp.write(chunk)
        except UpstreamError as err:
            conn.close()
            if request.client_gone:
                return resp  # the caller left too
            self.metrics.upstream_error(b.model, b.replica, "midstream")
            tid = _trace_id(request)
            log.warning("replica %s (%s) failed mid-response: %s (trace %s)", b.replica, b.endpoint, err.reason,
                        tid, extra={"trace_id": tid, "model": b.model, "replica": b.replica})
            if sse:
                await resp.write(b"data: " + errors.error_body(
                    f"The engine of replica {b.replica} failed mid-response", "upstream_error",
                    None, "upstream_disconnected") + b"\n\n")
                resp.end()
            else:
                resp.abort()
            return resp
        except ConnectionResetError:
            conn.close()  # the caller left: drop the engine's connection so it stops generating
            return resp
        if relabel is not None:
            rest = relabel.end()
            if rest:
                await resp.write(rest)
        resp.end()
        if timer is not None:
            _used(request, timer.end())
        return resp

    def _made(self, call: Call, b: Backend, body: bytes) -> bytes:
        """A whole response of `b`'s engine, 200: its usage to the caller's key (not a stored
        response's, retrieved or cancelled: counted when it was made); the body to send, a
        Responses API answer's ids naming the replica."""
        request = call.request
        path = request.path
        if path in ROUTED:
            _used(request, self.metrics.usage(b.model, body, call.body.predicted))
        return Relabel(b.replica).whole(body) if path.startswith(RESPONSES) else body

    def _answered(self, b: Backend) -> None:
        """The engine's response started (not a 503): its failure streak ends."""
        outliers = self.outliers
        if outliers.failures or outliers.ejections:
            outliers.succeeded(b.replica)


class Exchange:
    """A call forwarded from protocol callbacks: sent on an idle connection; answered from the
    engine's connection's callback when the response is small, whole and not retried (_retried). Else (and
    on any failure, or with no idle connection to send it on) it goes on in a task
    (Proxy.hand_over, then Proxy.go_on), which picks the connection up as it is."""

    __slots__ = ("px", "call", "backend", "conn", "_head")

    def __init__(self, px: Proxy, call: Call, b: Backend, conn: Conn | None):
        self.px, self.call, self.backend, self.conn = px, call, b, conn
        self._head: bytes | None = None  # the response's header lines, once it is known to be buffered
        if conn is None:
            self._hand_over()
            return
        px.balancer.acquire(b)
        request = call.request
        request.on_lost = self._client_left
        conn.listener = self._progress
        try:
            _send(conn, request, b, call.body.for_backend(b, call.name), _fields(request))
        except UpstreamError:  # closed since it was idle: a new connection, in a task
            self._let_go(conn)
            self.conn = None
            self._hand_over()

    def _progress(self) -> None:
        conn = self.conn
        assert conn is not None  # it listens to one
        if conn.failed is not None:
            return self._hand_over()
        head = self._head
        if head is None:
            if not conn.status:
                return  # no headers yet
            headers, length, sse = _response_head(conn, self.backend)
            if _retried(conn.status, self.backend) or not _buffered(length, sse):
                return self._hand_over()
            self.px._answered(self.backend)
            self._head = head = headers
            conn.read_whole()
        if conn.complete:
            self._done(conn, head)

    def _done(self, conn: Conn, head: bytes) -> None:
        call = self.call
        request = call.request
        request.on_lost = None
        resp = Response(conn.status, head, conn.body())
        self._let_go(conn)
        if resp.status == 200:   # before finished(), which lets go of the key's ticket
            resp.body = self.px._made(call, self.backend, resp.body)
        self.px.finished(call, resp.status)
        request.answer(resp)

    def _hand_over(self) -> None:
        if self.conn is not None:
            self.conn.listener = None
        self.call.request.on_lost = None
        self.px.hand_over(self)

    def _client_left(self) -> None:
        conn = self.conn
        assert conn is not None  # on_lost is set only with one
        conn.close()  # the engine stops generating
        self._let_go(conn)
        self.px.finished(self.call, 499)

    def _let_go(self, conn: Conn) -> None:
        """Done with the connection (back to the pool iff reusable) and with the replica."""
        conn.listener = None
        self.px.pool.release(conn)
        self.px.balancer.release(self.backend)


def _retried(status: int, b: Backend) -> bool:
    """An answer the gateway does not pass on but retries: an engine's 503 (loading, draining), or
    its 404 to a request for an adapter (unloaded as the gateway routed there)."""
    return status == 503 or (status == 404 and b.base is not None)


def _used(request: Request, counted: tuple[int, int] | None) -> None:
    """The engine's usage (prompt, completion tokens) of a request's answer, to its key's ticket."""
    ticket = request.ticket
    if ticket is not None:
        ticket.used(counted)


def _fields(request: Request) -> bytes:
    """The request's header lines to pass on: without hop-by-hop ones, the Host line and Content-Length,
    and with the traceparent the gateway continues or starts (llmgw/gateway/trace.py)."""
    lines = [k + b": " + v + b"\r\n" for k, v in request.headers if k.lower() not in _DROP_REQ]
    if request.traceparent is None:   # once per request: a retry is the same trace
        request.traceparent = trace.traceparent(request.header(trace.HEADER))
    lines.append(trace.HEADER + b": " + request.traceparent + b"\r\n")
    return b"".join(lines)


def _trace_id(request: Request) -> str | None:
    return trace.trace_id(request.traceparent) if request.traceparent else None


def _send(conn: Conn, request: Request, b: Backend, data: bytes, fields: bytes) -> None:
    conn.send(b"%s %s HTTP/1.1\r\nHost: %s\r\n%sContent-Length: %d\r\n\r\n" % (
        request.method, request.target, b.endpoint.encode(), fields, len(data)), data)


def _response_head(conn: Conn, b: Backend) -> tuple[bytes, int | None, bool]:
    """The engine's header lines to pass on (plus which replica answered), its Content-Length,
    and whether it is a stream of server-sent events."""
    lines = []
    length = None
    sse = False
    for k, v in conn.headers:
        lk = k.lower()
        if lk in _DROP_RESP:
            if lk == b"content-length":
                length = int(v)
            continue
        if lk == b"content-type":
            sse = v.startswith(b"text/event-stream")
        lines.append(k + b": " + v + b"\r\n")
    lines.append(_REPLICA_LINE + b.replica.encode() + b"\r\n")
    return b"".join(lines), length, sse


def _buffered(length: int | None, sse: bool) -> bool:
    """Whether a response is read whole and sent in one write (else relayed as it comes)."""
    return not sse and length is not None and length <= _BUFFER_LIMIT
