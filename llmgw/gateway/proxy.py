"""The gateway's HTTP app: OpenAI-compatible routes proxied to Ready replicas.

An aiohttp server faces the clients; a lean keep-alive pool (upstream.py,
httptools' parser) talks to the engines. A request is routed by its body's
`model` (a model name or an alias) to the replica with the fewest
outstanding requests. A connection failure before the engine's first byte
(refused, reset, disconnected before the headers) or a 503 from the engine
is retried once on another replica. Server-sent events are relayed chunk by
chunk as they arrive, never buffered.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time

from aiohttp import web
from multidict import CIMultiDict

from llmgw.gateway import errors
from llmgw.gateway.apikeys import ApiKeys
from llmgw.gateway.balancer import Balancer
from llmgw.gateway.metrics import Metrics
from llmgw.gateway.table import Backend, RoutingTable
from llmgw.gateway.upstream import Conn, Pool, UpstreamError

log = logging.getLogger(__name__)

REPLICA_HEADER = "X-Llmgw-Replica"  # which replica answered, on every proxied response
PROXIED = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
DEFAULT_MAX_BODY = 16 * 1024 * 1024
# Responses up to this size with a Content-Length are read whole and sent in one write.
_BUFFER_LIMIT = 1 << 20

_HOP = frozenset({
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailer",
    b"transfer-encoding", b"upgrade", b"host", b"content-length",
})
# The gateway's key is not the engine's business; the body is sent at once, so no Expect.
_DROP_REQ = _HOP | {b"authorization", b"expect"}
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
        synced: bool = True,
    ):
        self.table = table if table is not None else RoutingTable()
        self.api_keys = api_keys
        self.max_body_bytes = max_body_bytes
        self.retry_after = retry_after
        self.connect_timeout = connect_timeout
        self.balancer = Balancer()
        self.metrics = Metrics(self._inflight_samples)
        self.synced = synced  # False until the source has given a first full view
        self.pool = Pool(connect_timeout=connect_timeout)

    # ------------------------------------------------------------ app

    def app(self) -> web.Application:
        # Bodies are read by hand (to answer 413 in OpenAI's format); the +1
        # keeps aiohttp's own check from firing first.
        app = web.Application(client_max_size=self.max_body_bytes + 1)
        for path in PROXIED:
            app.router.add_post(path, self._proxy)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/v1/models/{name}", self._model)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/metrics", self._metrics)
        app.on_cleanup.append(self._close)
        return app

    async def _close(self, app: web.Application) -> None:
        self.pool.close()

    def _inflight_samples(self):
        """(model, replica, n, routable) for every routable replica and any still busy after leaving."""
        inflight = self.balancer.inflight
        for b in self.table.backends.values():
            yield b.model, b.replica, inflight.get(b.replica, 0), True
        for replica, n in list(inflight.items()):
            if replica not in self.table.backends:
                yield self.balancer.model_of.get(replica, "-"), replica, n, False

    # ------------------------------------------------------------ handlers

    def _auth(self, request: web.Request) -> web.Response | None:
        if self.api_keys is None:
            return None
        why = self.api_keys.check(request.headers.get("Authorization"))
        return errors.unauthorized(why) if why else None

    async def _proxy(self, request: web.Request) -> web.StreamResponse:
        start = time.perf_counter()
        resp, label = None, "-"
        try:
            resp, label = await self._route(request)
            return resp
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception:
            log.exception("gateway error on %s", request.path)
            resp = errors.error_response(500, "The gateway failed on this request; see its log",
                                         "internal_error", None, "gateway_error")
            return resp
        finally:
            code = resp.status if resp is not None else 499  # None: the caller went away
            self.metrics.observe(label, code, time.perf_counter() - start)

    async def _route(self, request: web.Request) -> tuple[web.StreamResponse, str]:
        """The response and the model label for the metrics ("-" when no model was resolved)."""
        denied = self._auth(request)
        if denied is not None:
            return denied, "-"
        parsed = await self._read_body(request)
        if isinstance(parsed, web.Response):
            return parsed, "-"
        body, name = parsed
        model = self.table.resolve(name)
        if model is None:
            return errors.model_not_found(name, self.table.known_names()), "-"
        return await self._forward(request, body, name, model), model

    async def _read_body(self, request: web.Request):
        limit = self.max_body_bytes
        length = request.content_length  # parses the header on every access: once
        if length is not None and length > limit:
            return errors.too_large(limit)
        try:
            body = await request.content.readexactly(length) if length is not None else await request.read()
        except (web.HTTPRequestEntityTooLarge, asyncio.IncompleteReadError):
            return errors.too_large(limit) if length is None else \
                errors.bad_request("The request body ended before its Content-Length")
        if len(body) > limit:
            return errors.too_large(limit)
        try:
            # '{' then a non-NUL byte is UTF-8 (UTF-16/32 LE put NULs after it, BE and BOMs
            # before): decoding it here skips json's encoding detection, a Python function.
            doc = json.loads(body.decode() if body[:1] == b"{" and body[1:2] != b"\x00" else body)
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

    async def _forward(self, request: web.Request, body: "_Body", name: str, model: str) -> web.StreamResponse:
        backends = self.table.backends_for(model)
        if not backends:
            return errors.no_replica(model, self.retry_after)
        # The request head minus the Host line and Content-Length, built once for both tries.
        fields = b"".join([k + b": " + v + b"\r\n" for k, v in request.raw_headers
                           if k.lower() not in _DROP_REQ])
        tried: list[str] = []
        last = "no replica"
        for attempt in (0, 1):
            b = self.balancer.pick(model, self.table.backends_for(model) if attempt else backends, tried)
            fresh = False
            if b is None and attempt:
                # No other replica: one more try on the same one, on a fresh connection.
                b = self.balancer.pick(model, self.table.backends_for(model))
                fresh = True
            if b is None:
                break
            if attempt:
                self.metrics.retry(model)
            try:
                return await self._attempt(request, b, body.for_backend(b, name), fields, fresh)
            except _Retry as r:
                last = f"{b.replica} ({b.endpoint}): {r.reason}"
                self.metrics.upstream_error(model, b.replica, r.reason.split(":")[0])
                log.info("upstream %s failed before its first byte; %s", last,
                         "retrying" if attempt == 0 else "giving up")
                tried.append(b.replica)
        if not self.table.backends_for(model) or last.endswith(_ENGINE_503):
            return errors.no_replica(model, self.retry_after)
        return errors.bad_gateway(f"No replica of model '{model}' answered: {last}")

    async def _attempt(self, request: web.Request, b: Backend, data: bytes, fields: bytes,
                       fresh: bool) -> web.StreamResponse:
        self.balancer.acquire(b)
        conn = None
        try:
            try:
                conn = await self.pool.acquire(b.endpoint, fresh)
                conn.send(b"POST %s HTTP/1.1\r\nHost: %s\r\n%sContent-Length: %d\r\n\r\n" % (
                    request.path.encode(), b.endpoint.encode(), fields, len(data)), data)
                await conn.headers_done()
            except UpstreamError as err:
                raise _Retry(err.reason) from None
            return await self._relay(request, conn, b)
        finally:
            if conn is not None:
                self.pool.release(conn)  # reused only if its response was read to the end
            self.balancer.release(b)

    async def _relay(self, request: web.Request, conn: Conn, b: Backend) -> web.StreamResponse:
        if conn.status == 503:
            raise _Retry(_ENGINE_503)
        headers = CIMultiDict()
        length = None
        sse = False
        for k, v in conn.headers:
            lk = k.lower()
            if lk in _DROP_RESP:
                if lk == b"content-length":
                    length = int(v)
                continue
            value = v.decode("utf-8", "replace")
            if lk == b"content-type":
                sse = value.startswith("text/event-stream")
            headers.add(k.decode("latin-1"), value)
        headers[REPLICA_HEADER] = b.replica
        if not sse and length is not None and length <= _BUFFER_LIMIT:
            try:
                data = await conn.read_all()
            except UpstreamError as err:
                raise _Retry(err.reason) from None  # nothing sent to the client yet
            return web.Response(status=conn.status, body=data, headers=headers)
        resp = web.StreamResponse(status=conn.status, headers=headers)
        if not sse and length is not None:
            resp.content_length = length
        await resp.prepare(request)
        try:
            while True:
                chunk = await conn.read_chunk()
                if not chunk:
                    break
                await resp.write(chunk)
        except UpstreamError as err:
            conn.close()
            if _is_client_side(request):
                return resp  # the caller left too
            self.metrics.upstream_error(b.model, b.replica, "midstream")
            log.warning("replica %s (%s) failed mid-response: %s", b.replica, b.endpoint, err.reason)
            if sse:
                await resp.write(b"data: " + errors.error_body(
                    f"The engine of replica {b.replica} failed mid-response", "upstream_error",
                    None, "upstream_disconnected") + b"\n\n")
                await resp.write_eof()
            else:
                request.transport and request.transport.close()
            return resp
        except ConnectionResetError:
            conn.close()  # the caller left: drop the engine's connection so it stops generating
            return resp
        await resp.write_eof()
        return resp

    async def _models(self, request: web.Request) -> web.Response:
        denied = self._auth(request)
        if denied is not None:
            return denied
        data = []
        for model, aliases, created in self.table.routable_models():
            data.append(_model_card(model, model, created, aliases))
            data.extend(_model_card(a, model, created, ()) for a in aliases)
        return web.json_response({"object": "list", "data": data})

    async def _model(self, request: web.Request) -> web.Response:
        denied = self._auth(request)
        if denied is not None:
            return denied
        name = request.match_info["name"]
        for model, aliases, created in self.table.routable_models():
            if name == model or name in aliases:
                return web.json_response(_model_card(name, model, created, aliases if name == model else ()))
        return errors.model_not_found(name, self.table.known_names())

    async def _healthz(self, request: web.Request) -> web.Response:
        body = {
            "status": "ok" if self.synced else "syncing",
            "models": len(self.table.models),
            "routableReplicas": len(self.table.backends),
        }
        return web.json_response(body, status=200 if self.synced else 503)

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), headers={"Content-Type": self.metrics.content_type})


class _Body:
    """The request body, rewritten only for an engine that does not serve the requested name."""

    __slots__ = ("raw", "doc")

    def __init__(self, raw: bytes, doc: dict):
        self.raw, self.doc = raw, doc

    def for_backend(self, b: Backend, name: str) -> bytes:
        other = b.upstream_name(name)
        if other is None:
            return self.raw
        return json.dumps({**self.doc, "model": other}).encode()


def _model_card(id_: str, root: str, created: int, aliases) -> dict:
    card = {"id": id_, "object": "model", "created": created, "owned_by": "llmgw", "root": root}
    if aliases:
        card["aliases"] = list(aliases)
    return card


def _is_client_side(request: web.Request) -> bool:
    t = request.transport
    return t is None or t.is_closing()
