"""The gateway's HTTP app: OpenAI-compatible routes proxied to Ready replicas.

A lean HTTP/1.1 server (server.py, httptools' parser) faces the clients; a lean
keep-alive pool (upstream.py, the same parser) talks to the engines. A request
is routed by its body's `model` (a model name or an alias) to the replica
with the fewest outstanding requests, or by the model's cache-aware policy
(balancer.py; the policies in llmgw/routing/). A connection failure before the
engine's first byte (refused, reset, disconnected before the headers, no
headers within the response timeout) or a 503 from the engine is retried once
on another replica; a replica that keeps failing so is left out of routing
for a while (outlier.py). Server-sent events
are relayed chunk by chunk as they arrive, never buffered.

The common case (the body at hand, an idle connection to the replica picked,
a small response with a length) is answered from protocol callbacks, without
a task or a coroutine (`Gateway.begin`, `_Exchange`); whatever else happens on
the way (a retry, a stream, a failure) continues in a task, on the same path
as a request that began there.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from llmgw.api.limits import parse_json
from llmgw.api.types import ApiKey
from llmgw.gateway import errors, trace
from llmgw.gateway.admission import Admission, Ticket
from llmgw.gateway.apikeys import ApiKeys
from llmgw.gateway.balancer import Balancer
from llmgw.gateway.keyring import KeyRing
from llmgw.gateway.metrics import Metrics
from llmgw.gateway.outlier import Outliers
from llmgw.gateway.queue import UNLIMITED, WaitQueues
from llmgw.gateway.response import Response, json_response
from llmgw.gateway.server import BodyError, HttpServer, Limits, Request, Stream, TimedOut, TooLarge
from llmgw.gateway.spans import Spans
from llmgw.gateway.table import Backend, RoutingTable
from llmgw.gateway.upstream import CONNECT_TIMED_OUT, Conn, Pool, UpstreamError
from llmgw.routing import RoutingPolicy
from llmgw.routing.prefix import SESSION_HEADER

log = logging.getLogger(__name__)

REPLICA_HEADER = "X-Llmgw-Replica"  # which replica answered, on every proxied response
_REPLICA_LINE = REPLICA_HEADER.encode() + b": "
PROXIED = frozenset((b"/v1/chat/completions", b"/v1/completions", b"/v1/embeddings"))
_MODELS = b"/v1/models"
_MODEL_PREFIX = b"/v1/models/"
_GET_ROUTES = frozenset((_MODELS, b"/healthz", b"/metrics"))
DEFAULT_MAX_BODY = 16 * 1024 * 1024
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


class _Retry(Exception):
    def __init__(self, reason: str):
        self.reason = reason


class Gateway:
    def __init__(
        self,
        table: RoutingTable | None = None,
        api_keys: ApiKeys | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY,
        retry_after: int = 2,
        connect_timeout: float = 5.0,
        response_timeout: float | None = None,
        idle_timeout: float | None = None,
        synced: bool = True,
        limits: Limits = Limits(),
        queue: QueueSettings | None = None,
    ):
        self.table = table if table is not None else RoutingTable()
        self.api_keys = api_keys
        self.max_body_bytes = max_body_bytes
        self.retry_after = retry_after
        self.connect_timeout = connect_timeout
        self.balancer = Balancer()
        self.outliers = Outliers(self._accepts)
        self.metrics = Metrics(self._inflight_samples)
        self.spans: Spans | None = None  # OpenTelemetry export, when --otel asks for it
        self.keys: KeyRing | None = None  # ApiKey objects (watch_keys), instead of or beside a key file
        self.admission: Admission | None = None
        q = queue or QueueSettings()
        self.model_concurrency = q.model_concurrency
        self.queue = WaitQueues(self._room, size=q.size, timeout=q.timeout)
        self.table.on_change = self.queue.wake_all
        if q.model_concurrency:
            self.balancer.on_release = self.queue.wake
        self.synced = synced  # False until the source has given a first full view
        self.pool = Pool(connect_timeout=connect_timeout, response_timeout=response_timeout,
                         idle_timeout=idle_timeout)
        self.server = HttpServer(self.handle, max_body=max_body_bytes, limits=limits, begin=self.begin)

    async def start(self, host: str, port: int, backlog: int = 1024) -> int:
        """Serve on host:port (0: any free port); the port."""
        await self.server.start(host, port, backlog)
        return self.server.port

    async def stop(self, grace: float = 60.0) -> None:
        """Stop accepting; requests in flight get `grace` seconds to finish."""
        await self.server.close(grace)
        self.pool.close()
        self.outliers.close()

    def watch_keys(self) -> KeyRing:
        """Authenticate by ApiKey objects, admitted by their limits: the ring the source feeds."""
        self.admission = Admission(self.table.labels, self.table.resolve)
        self.keys = KeyRing(self.admission.revoke)
        self.metrics.registry.register(self.admission.collector())
        return self.keys

    def finished(self, request: Request, model: str, code: int, seconds: float) -> None:
        """A proxied request answered: its metrics, and its span if spans are exported."""
        ticket = request.ticket
        if ticket is not None:
            request.ticket = None
            ticket.release()
        self.metrics.observe(model, code, seconds)
        if self.spans is not None:
            self.spans.request(request.path, request.traceparent, request.header(trace.HEADER), model, code, seconds)

    @property
    def synced(self) -> bool:
        return self._synced

    @synced.setter
    def synced(self, value: bool) -> None:
        self._synced = value
        if value:
            self.queue.set_synced()  # requests held since a restart find their models now

    def _room(self, model: str) -> int | None:
        """How many more of the model's requests may go now; None: it has no Ready replica."""
        if not self.table.backends_for(model):
            return None
        if not self.model_concurrency:
            return UNLIMITED
        return self.model_concurrency - self.balancer.per_model.get(model, 0)

    def _inflight_samples(self) -> Iterator[tuple[str, str, int, bool]]:
        """(model, replica, n, routable) for every routable replica and any still busy after leaving."""
        inflight = self.balancer.inflight
        for b in self.table.backends.values():
            yield b.model, b.replica, inflight.get(b.replica, 0), True
        for replica, n in list(inflight.items()):
            if replica not in self.table.backends:
                yield self.balancer.model_of.get(replica, "-"), replica, n, False

    # ------------------------------------------------------------ routes

    async def handle(self, request: Request) -> Response | Stream:
        path, method = request.path, request.method
        if path in PROXIED:
            if method == b"POST":
                return await self._proxy(request)
            return errors.method_not_allowed(method.decode(), "POST")
        if path in _GET_ROUTES or path.startswith(_MODEL_PREFIX):
            if method != b"GET" and method != b"HEAD":
                return errors.method_not_allowed(method.decode(), "GET")
            if path == b"/healthz":
                return self._healthz()
            if path == b"/metrics":
                return Response(200, b"Content-Type: %s\r\n" % self.metrics.content_type.encode(),
                                self.metrics.render())
            denied = self._auth(request)
            if denied is not None:
                return denied
            key = await self._key(request)
            if isinstance(key, Response):
                return key
            if path == _MODELS:
                return self._models(key)
            return self._model(unquote(path[len(_MODEL_PREFIX):].decode("utf-8", "replace")), key)
        return errors.not_found(path.decode("latin-1"))

    def _auth(self, request: Request) -> Response | None:
        if self.api_keys is None:
            return None
        value = request.header(b"authorization")
        why = self.api_keys.check(value.decode("latin-1") if value is not None else None)
        return errors.unauthorized(why) if why else None

    async def _proxy(self, request: Request, begun: "_Exchange | None" = None) -> Response | Stream:
        """Route and forward `request`, or go on with the exchange `begin` started for it."""
        start = time.perf_counter() if begun is None else begun.start
        code, label = 499, "-"  # 499 unless an answer is made: the caller went away
        try:
            if begun is None:
                resp, label = await self._route(request)
            else:
                label = begun.model
                resp = await self._go_on(begun)
            code = resp.status
            return resp
        except Exception:
            code = 500  # the server logs it and answers 500 (server.py)
            raise
        finally:
            self.finished(request, label, code, time.perf_counter() - start)

    async def _route(self, request: Request) -> tuple[Response | Stream, str]:
        """The response and the model label for the metrics ("-" when no model was resolved)."""
        denied = self._auth(request)
        if denied is not None:
            return denied, "-"
        key = await self._key(request)
        if isinstance(key, Response):
            return key, "-"
        try:
            raw = await request.body()
        except TooLarge:
            return errors.too_large(self.max_body_bytes), "-"
        except TimedOut as err:
            return errors.request_timeout(str(err)), "-"
        except BodyError as err:  # cut short, or its chunks malformed
            return errors.bad_request(str(err)), "-"
        parsed = self._parse(raw)
        if type(parsed) is Response:  # final: no subclass to miss
            return parsed, "-"
        body, name = parsed
        model = self.table.resolve(name)
        if model is None and not self.synced:  # just started: the table may not know it yet
            if not await self.queue.synced():
                return errors.syncing(self.retry_after), "-"
            model = self.table.resolve(name)
        if model is None or key is not None and not self._allows(key, model):
            return errors.model_not_found(name, self._known(key)), "-"
        if key is not None:
            limited = self._admit(request, body, key, model)
            if limited is not None:
                assert self.admission is not None   # with keys
                self.admission.refused(key.name, model)
                return limited, model
        if self.queue.blocked(model):  # no replica yet, at its limit, or others wait before it
            refused = await self.queue.wait(model, request.priority,
                                            lambda leave: setattr(request, "on_eof", leave))
            request.on_eof = None
            if refused is not None:
                return errors.queue_refused(model, refused, self.retry_after), model
        return await self._forward(request, body, name, model), model

    async def _key(self, request: Request) -> ApiKey | Response | None:
        """The request's ApiKey (None without keys), or the 401 it gets."""
        if self.keys is None:
            return None
        key = await self.keys.check(request.header(b"authorization"))
        return errors.unauthorized(key) if isinstance(key, str) else key

    def _allows(self, key: ApiKey, model: str) -> bool:
        assert self.admission is not None   # with keys
        return self.admission.allows(key, model)

    def _known(self, key: ApiKey | None) -> list[str]:
        """The model names a 404 lists: those the key may call (a key learns of no other model)."""
        names = self.table.known_names()
        if key is None:
            return names
        return [n for n in names if self._allows(key, self.table.resolve(n) or n)]

    def _admit(self, request: Request, body: "_Body", key: ApiKey, model: str) -> Response | None:
        """Admit a request of `key` by its limits (admission.py): None, or the 429 it gets."""
        assert self.admission is not None   # with keys
        ticket = self.admission.admit(key, model, request.abort)
        if not isinstance(ticket, Ticket):
            return ticket
        request.ticket = ticket
        request.priority = key.spec.priorityClass   # the model's wait queue orders by it (queue.py)
        if key.spec.limits.tokensPerMinute is not None:
            body.ask_usage()
        return None

    def _parse(self, body: bytes) -> "Response | tuple[_Body, str]":
        """The body and the model it names, or the 400 it deserves."""
        try:
            # '{' then a non-NUL byte is UTF-8 (UTF-16/32 LE put NULs after it, BE and BOMs
            # before): decoding it here skips json's encoding detection, a Python function.
            text = body.decode() if body[:1] == b"{" and body[1:2] != b"\x00" else body
            doc = parse_json(text, unique_keys=False)  # bounded nesting: llmgw.api.limits
        except (ValueError, UnicodeDecodeError) as err:
            return errors.bad_request(
                f"We could not parse the JSON body of your request ({err}); "
                "send a JSON object with 'Content-Type: application/json'")
        if not isinstance(doc, dict):
            return errors.bad_request("The request body must be a JSON object")
        name = doc.get("model")
        if not isinstance(name, str) or not name:
            return errors.bad_request(
                "You must provide a model parameter (a model name or alias; see GET /v1/models)",
                param="model", code="missing_required_parameter")
        return _Body(body, doc), name

    async def _forward(self, request: Request, body: "_Body", name: str, model: str,
                       failed: "tuple[Backend, str] | None" = None) -> Response | Stream:
        """Try a replica, and on a failure before its first byte one more; `failed`: the first
        try has been made (by begin) and failed, for this reason."""
        backends = self.table.backends_for(model)
        if not backends and failed is None:
            return errors.no_replica(model, self.retry_after)
        fields = _fields(request)
        tried: list[str] = []
        last = "no replica"
        b: Backend | None
        if failed is not None:
            b, reason = failed
            last = self._failed(request, model, b, reason, retrying=True)
            tried.append(b.replica)
        for attempt in (1,) if failed is not None else (0, 1):
            b = self._pick(request, body, model, self.table.backends_for(model) if attempt else backends, tried)
            fresh = False
            if b is None and attempt:
                # No other replica: one more try on the same one, on a fresh connection.
                b = self._pick(request, body, model, self.table.backends_for(model))
                fresh = True
            if b is None:
                break
            if attempt:
                self.metrics.retry(model)
            try:
                return await self._attempt(request, b, body.for_backend(b, name), fields, fresh)
            except _Retry as r:
                last = self._failed(request, model, b, r.reason, retrying=attempt == 0)
                tried.append(b.replica)
        if not self.table.backends_for(model) or last.endswith(_ENGINE_503):
            return errors.no_replica(model, self.retry_after)
        return errors.bad_gateway(f"No replica of model '{model}' answered: {last}")

    def _pick(self, request: Request, body: "_Body", model: str, backends: list[Backend],
              exclude: Collection[str] = ()) -> Backend | None:
        """The replica for this request by its model's policy; the key is made once per request."""
        policy = self.balancer.policy(model, self.table.routing(model))
        if body.key is None or body.key[0] is not policy:  # (a retry may find the Model changed)
            body.key = (policy, policy.key(body.doc, request.header(SESSION_HEADER)))
        if self.outliers.ejections:
            exclude = self.outliers.excluded((b.replica for b in backends), exclude)
        return policy.pick(backends, self.balancer.inflight, body.key[1], exclude)

    def _failed(self, request: Request, model: str, b: Backend, reason: str, retrying: bool) -> str:
        """Count and log a try that failed before the engine's first byte; what to tell the caller."""
        last = f"{b.replica} ({b.endpoint}): {reason}"
        if reason != _ENGINE_503:   # a loading or draining engine says so; not an outlier
            self.outliers.failed(b.replica, b.endpoint, at_once=reason.startswith(CONNECT_TIMED_OUT))
        self.metrics.upstream_error(model, b.replica, reason.split(":")[0])
        tid = _trace_id(request)
        log.info("upstream %s failed before its first byte; %s (trace %s)", last,
                 "retrying" if retrying else "giving up", tid, extra={"trace_id": tid, "model": model})
        return last

    async def _attempt(self, request: Request, b: Backend, data: bytes, fields: bytes,
                       fresh: bool) -> Response | Stream:
        self.balancer.acquire(b)
        conn = None
        try:
            conn = await self.pool.acquire(b.endpoint, fresh)
            _send(conn, request, b, data, fields)
        except BaseException as err:
            if conn is not None:
                self.pool.release(conn)
            self.balancer.release(b)
            if isinstance(err, UpstreamError):
                raise _Retry(err.reason) from None
            raise
        return await self._answer(request, b, conn)

    async def _answer(self, request: Request, b: Backend, conn: Conn) -> Response | Stream:
        """The engine's answer to the request sent on `conn`; ends the hold on `b` and `conn`."""
        try:
            try:
                await conn.headers_done()
            except UpstreamError as err:
                raise _Retry(err.reason) from None
            return await self._relay(request, conn, b)
        finally:
            self.pool.release(conn)  # reused only if its response was read to the end
            self.balancer.release(b)

    async def _relay(self, request: Request, conn: Conn, b: Backend) -> Response | Stream:
        if conn.status == 503:
            raise _Retry(_ENGINE_503)
        self._answered(b)
        headers, length, sse = _response_head(conn, b)
        if _buffered(length, sse):
            try:
                data = await conn.read_all()
            except UpstreamError as err:
                raise _Retry(err.reason) from None  # nothing sent to the client yet
            if conn.status == 200:
                _used(request, self.metrics.usage(b.model, data))
            return Response(conn.status, headers, data)
        resp = request.stream(conn.status, headers, None if sse else length)
        timer = self.metrics.stream(b.model, request.received) if sse and conn.status == 200 else None
        try:
            while True:
                chunk = await conn.read_chunk()
                if not chunk:
                    break
                if timer is not None:
                    timer.chunk(chunk)
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
        resp.end()
        if timer is not None:
            _used(request, timer.end())
        return resp

    async def _accepts(self, endpoint: str) -> bool:
        """Whether the engine at `endpoint` accepts a connection within the connect timeout (an
        ejected replica's way back)."""
        host, _, port = endpoint.rpartition(":")
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host.strip("[]"), int(port)),
                                               self.connect_timeout)
        except (OSError, ValueError, asyncio.TimeoutError):
            return False
        writer.close()
        return True

    def _answered(self, b: Backend) -> None:
        """The engine's response started (not a 503): its failure streak ends."""
        outliers = self.outliers
        if outliers.failures or outliers.ejections:
            outliers.succeeded(b.replica)

    # ------------------------------------------------------------ without a task

    def begin(self, request: Request) -> bool:
        """The server's offer of a complete request: take it (True) if it is proxied, valid and
        routable; anything else (False) the handler answers, with the error it deserves."""
        if request.path not in PROXIED or request.method != b"POST" or self._auth(request) is not None:
            return False
        key = None
        if self.keys is not None:   # a key verified before, or the handler verifies it
            checked = self.keys.check_now(request.header(b"authorization"))
            if not isinstance(checked, ApiKey):
                return False
            key = checked
        raw = request.body_at_hand()
        if raw is None:
            return False
        parsed = self._parse(raw)
        if type(parsed) is Response:  # final: no subclass to miss
            return False
        body, name = parsed
        model = self.table.resolve(name)
        if model is None or self.queue.blocked(model) or key is not None and not self._allows(key, model):
            return False
        b = self._pick(request, body, model, self.table.backends_for(model))
        if b is None:
            return False
        if key is not None and self._admit(request, body, key, model) is not None:
            return False   # the handler answers the refusal (and counts it)
        _Exchange(self, request, body, name, model, b, self.pool.idle(b.endpoint))
        return True

    async def _go_on(self, ex: "_Exchange") -> Response | Stream:
        """The rest of an exchange begin started, in a task: its answer, or a retry elsewhere."""
        try:
            if ex.conn is None:  # no idle connection to the replica picked: connect first
                return await self._attempt(ex.request, ex.backend, ex.body.for_backend(ex.backend, ex.name),
                                           _fields(ex.request), False)
            return await self._answer(ex.request, ex.backend, ex.conn)
        except _Retry as r:
            return await self._forward(ex.request, ex.body, ex.name, ex.model, failed=(ex.backend, r.reason))

    def _models(self, key: ApiKey | None) -> Response:
        data = []
        for model, aliases, created in self.table.routable_models():
            if key is not None and not self._allows(key, model):
                continue
            data.append(_model_card(model, model, created, aliases))
            data.extend(_model_card(a, model, created, ()) for a in aliases)
        return json_response({"object": "list", "data": data})

    def _model(self, name: str, key: ApiKey | None) -> Response:
        for model, aliases, created in self.table.routable_models():
            if (name == model or name in aliases) and (key is None or self._allows(key, model)):
                return json_response(_model_card(name, model, created, aliases if name == model else ()))
        return errors.model_not_found(name, self._known(key))

    def _healthz(self) -> Response:
        body = {
            "status": "ok" if self.synced else "syncing",
            "models": len(self.table.models),
            "routableReplicas": len(self.table.backends),
        }
        return json_response(body, status=200 if self.synced else 503)


@dataclass(frozen=True)
class QueueSettings:
    """Each model's wait queue (queue.py): how many requests, how long, and the concurrency limit
    per model at this gateway past which requests wait (0: none)."""

    size: int = 1000
    timeout: float = 60.0
    model_concurrency: int = 0


class _Exchange:
    """A request proxied from protocol callbacks: sent on an idle connection; answered from the
    engine's connection's callback when the response is small, whole and not a 503. Else (and
    on any failure, or with no idle connection to send it on) it goes on in a task
    (Gateway._go_on), which picks the connection up as it is."""

    __slots__ = ("gw", "request", "body", "name", "model", "backend", "conn", "start", "_head")

    def __init__(self, gw: Gateway, request: Request, body: "_Body", name: str, model: str,
                 b: Backend, conn: Conn | None):
        self.gw, self.request, self.body, self.name, self.model = gw, request, body, name, model
        self.backend, self.conn = b, conn
        self.start = time.perf_counter()
        self._head: bytes | None = None  # the response's header lines, once it is known to be buffered
        if conn is None:
            self._hand_over()
            return
        gw.balancer.acquire(b)
        request.on_lost = self._client_left
        conn.listener = self._progress
        try:
            _send(conn, request, b, body.for_backend(b, name), _fields(request))
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
            if conn.status == 503 or not _buffered(length, sse):
                return self._hand_over()
            self.gw._answered(self.backend)
            self._head = head = headers
            conn.read_whole()
        if conn.complete:
            self._done(conn, head)

    def _done(self, conn: Conn, head: bytes) -> None:
        self.request.on_lost = None
        resp = Response(conn.status, head, conn.body())
        self._let_go(conn)
        if resp.status == 200:   # before finished(), which lets go of the key's ticket
            _used(self.request, self.gw.metrics.usage(self.model, resp.body))
        self.gw.finished(self.request, self.model, resp.status, time.perf_counter() - self.start)
        self.request.answer(resp)

    def _hand_over(self) -> None:
        if self.conn is not None:
            self.conn.listener = None
        self.request.on_lost = None
        self.request.resume(self.gw._proxy(self.request, self))

    def _client_left(self) -> None:
        conn = self.conn
        assert conn is not None  # on_lost is set only with one
        conn.close()  # the engine stops generating
        self._let_go(conn)
        self.gw.finished(self.request, self.model, 499, time.perf_counter() - self.start)

    def _let_go(self, conn: Conn) -> None:
        """Done with the connection (back to the pool iff reusable) and with the replica."""
        conn.listener = None
        self.gw.pool.release(conn)
        self.gw.balancer.release(self.backend)


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
    conn.send(b"POST %s HTTP/1.1\r\nHost: %s\r\n%sContent-Length: %d\r\n\r\n" % (
        request.path, b.endpoint.encode(), fields, len(data)), data)


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


class _Body:
    """The request body, rewritten only for an engine that does not serve the requested name."""

    __slots__ = ("raw", "doc", "key")

    def __init__(self, raw: bytes, doc: dict[str, Any]) -> None:
        self.raw, self.doc = raw, doc
        # (policy, key): the key the model's policy made of this request, once (its type is the policy's)
        self.key: tuple[RoutingPolicy, Any] | None = None

    def ask_usage(self) -> None:
        """A stream is to end with its usage (OpenAI's stream_options.include_usage), which the
        gateway counts against a token limit: set for a key with one, even if its client did not."""
        doc = self.doc
        options = doc.get("stream_options")
        if doc.get("stream") is True and not (isinstance(options, dict) and options.get("include_usage") is True):
            self.doc = {**doc, "stream_options": {**(options if isinstance(options, dict) else {}),
                                                  "include_usage": True}}
            self.raw = json.dumps(self.doc).encode()

    def for_backend(self, b: Backend, name: str) -> bytes:
        other = b.upstream_name(name)
        if other is None:
            return self.raw
        return json.dumps({**self.doc, "model": other}).encode()


def _model_card(id_: str, root: str, created: int, aliases: Sequence[str]) -> dict[str, Any]:
    card = {"id": id_, "object": "model", "created": created, "owned_by": "llmgw", "root": root}
    if aliases:
        card["aliases"] = list(aliases)
    return card

