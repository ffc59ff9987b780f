"""The gateway's HTTP app: OpenAI-compatible routes, each proxied request run through the chain
of steps (chain.py) and then forwarded to a Ready replica (proxy.py).

The chain runs first without a task, from the server's protocol callbacks (`Gateway.begin`):
the common request (its key known, its body at hand, its model with room) passes every step
and is forwarded at once. A step that must wait, and anything after it, goes on in a task
(`_proxy`), from that very step: both run the same steps in the same order.

No request waits on a path that is gone: when a replica leaves routing (the table's `on_leave`)
or is ejected (outlier.py), the tries in flight there that have no response headers yet fail at
once and go to another replica (proxy.py); when its engine is known dead (Failed, deleted),
its responses under way end too (a stream with an error event).
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

from llmgw.gateway import errors
from llmgw.gateway.admission import Admission
from llmgw.gateway.auth import Authenticator
from llmgw.gateway.balancer import Balancer
from llmgw.gateway.body import Body
from llmgw.gateway.chain import Chain, Wiring, standard
from llmgw.gateway.endpoints import ROUTED, endpoints_of
from llmgw.gateway.http1 import HttpServer, Limits, Request, Stream
from llmgw.gateway.kvindexes import KVIndexes
from llmgw.gateway.metrics import Metrics
from llmgw.gateway.outlier import Outliers
from llmgw.gateway.proxy import GONE, Exchange, Proxy
from llmgw.gateway.queue import UNLIMITED, WaitQueues
from llmgw.gateway.response import Response, json_response
from llmgw.gateway.responses import home
from llmgw.gateway.scope import Scope
from llmgw.gateway.spans import Spans
from llmgw.gateway.step import LATER, Call
from llmgw.gateway.steps.authenticate import Authenticate
from llmgw.gateway.steps.wait import Wait
from llmgw.gateway.table import Backend, RoutingTable
from llmgw.gateway.upstream import Keepalive, Pool, accepts
from llmgw.routing.precise_prefix import PrecisePrefix

_MODELS = b"/v1/models"
_MODEL_PREFIX = b"/v1/models/"
_RESPONSE_PREFIX = b"/v1/responses/"   # GET /v1/responses/{id}, POST /v1/responses/{id}/cancel
_CANCEL = b"/cancel"
_GET_ROUTES = frozenset((_MODELS, b"/healthz", b"/metrics"))
DEFAULT_MAX_BODY = 16 * 1024 * 1024


@dataclass(frozen=True)
class QueueSettings:
    """Each model's wait queue (queue.py): how many requests, how long, and the concurrency limit
    per model at this gateway past which requests wait (0: none)."""

    size: int = 1000
    timeout: float = 60.0
    model_concurrency: int = 0


class Gateway:
    """`authenticator`: who may call (the key file, or the watched ApiKeys; None: anyone);
    `admission`: the watched keys' scope and limits; `spans`: a span per request exported
    (--otel); `steps`: the chain, `standard` unless a test puts a step in it."""

    def __init__(
        self,
        table: RoutingTable | None = None,
        authenticator: Authenticator | None = None,
        admission: Admission | None = None,
        spans: Spans | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY,
        retry_after: int = 2,
        connect_timeout: float = 5.0,
        response_timeout: float | None = None,
        idle_timeout: float | None = None,
        keepalive: Keepalive | None = Keepalive(),
        synced: bool = True,
        limits: Limits = Limits(),
        queue: QueueSettings | None = None,
        steps: Chain = standard,
    ):
        self.table = table if table is not None else RoutingTable()
        self.kv = KVIndexes()
        self._following = False  # the KV event subscriptions follow the table (from start on: they need the loop)
        self.balancer = Balancer(self.kv)
        self.metrics = Metrics(self._inflight_samples)
        self.metrics.registry.register(self.kv)
        if admission is not None:
            self.metrics.registry.register(admission.collector())
        q = queue or QueueSettings()
        self.model_concurrency = q.model_concurrency
        self.queue = WaitQueues(self._room, size=q.size, timeout=q.timeout)
        self.table.on_change = self._table_changed
        if q.model_concurrency:
            self.balancer.on_release = self.queue.wake
        self.synced = synced  # False until the source has given a first full view
        self.pool = Pool(connect_timeout=connect_timeout, response_timeout=response_timeout,
                         idle_timeout=idle_timeout, tcp_keepalive=keepalive)
        self.table.on_leave = self._left
        self.outliers = Outliers(lambda endpoint: accepts(endpoint, connect_timeout),
                                 on_eject=lambda endpoint: self._abandon(
                                     endpoint, "its replica was ejected by outlier detection", False))
        self.proxy = Proxy(self.table, self.balancer, self.outliers, self.metrics, self.pool, spans, retry_after,
                           self._go_on, lambda call: self._wait.run(call))
        self.scope = Scope(self.table, admission)
        self.steps = tuple(steps(Wiring(self.table, self.queue, self.scope, authenticator, admission,
                                        lambda: self.synced, max_body_bytes, retry_after)))
        self._wait = Wait(self.queue, retry_after)   # a call sent back to its queue (Proxy.requeue)
        # the GET routes' own check of the caller (the chain is the proxied routes')
        self.authenticate = Authenticate(authenticator) if authenticator is not None else None
        self.server = HttpServer(self.handle, max_body=max_body_bytes, limits=limits, begin=self.begin)

    async def start(self, host: str, port: int, backlog: int = 1024) -> int:
        """Serve on host:port (0: any free port); the port."""
        await self.server.start(host, port, backlog)
        self._following = True
        self._follow_kv()
        return self.server.port

    async def stop(self, grace: float = 60.0) -> None:
        """Stop accepting; requests in flight get `grace` seconds to finish."""
        await self.server.close(grace)
        self.pool.close()
        self.outliers.close()
        await self.kv.close()

    def _table_changed(self) -> None:
        self.queue.wake_all()
        if self._following:
            self._follow_kv()

    def _follow_kv(self) -> None:
        """The KV indexes follow the publishing replicas; a precise-prefix Model's tokenizer is read from
        its source (a hub Model's fetched: none for a Model routed otherwise)."""
        self.kv.sync(self.table.backends.values(), {m.name: m.source for m in self.table.models.values()
                                                     if m.routing.policy == PrecisePrefix.name})

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

    def _left(self, b: Backend, dead: bool) -> None:
        if any(o.endpoint == b.endpoint for o in self.table.backends.values()):
            return   # its endpoint is another routable replica's now
        self._abandon(b.endpoint, f"replica {b.replica} left routing: "
                      + ("its engine failed or was deleted" if dead else "not Ready"), dead)

    def _abandon(self, endpoint: str, why: str, started: bool) -> None:
        """Fail the tries in flight to `endpoint` without headers, and with `started` the
        responses under way too."""
        self.pool.abandon(endpoint, GONE + why, started)

    def _inflight_samples(self) -> Iterator[tuple[str, str, int, bool]]:
        """(model, replica, n, routable) for every routable replica and any still busy after leaving."""
        inflight = self.balancer.inflight
        for b in self.table.backends.values():
            yield b.model, b.replica, inflight.get(b.replica, 0), True
        for replica, n in list(inflight.items()):
            if replica not in self.table.backends:
                yield self.balancer.model_of.get(replica, "-"), replica, n, False

    # ------------------------------------------------------------ the chain

    def begin(self, request: Request) -> bool:
        """The server's offer of a complete request: a proxied one is taken (True) and run
        through the chain here; from a step that must wait it goes on in a task. Anything else
        (False) the handler answers."""
        if request.path not in ROUTED or request.method != b"POST":
            return False
        call = Call(request)
        steps = self.steps
        for i in range(len(steps)):
            answer = steps[i].now(call)
            if answer is None:
                continue
            if answer is LATER:
                request.resume(self._proxy(call, i))
            else:
                self.proxy.finished(call, answer.status)
                request.answer(answer)
            return True
        if not self.proxy.begin(call):   # no replica picked now: the forwarding, in a task
            request.resume(self._proxy(call, len(steps)))
        return True

    async def _proxy(self, call: Call, at: int = 0, begun: Exchange | None = None) -> Response | Stream:
        """In a task: the chain from step `at`, then the forwarding; or the rest of the exchange
        `begun` without a task."""
        code = 499  # unless an answer is made: the caller went away
        try:
            resp = await (self._run(call, at) if begun is None else self.proxy.go_on(begun))
            code = resp.status
            return resp
        except Exception:
            code = 500  # the server logs it and answers 500 (http1.py)
            raise
        finally:
            self.proxy.finished(call, code)

    async def _run(self, call: Call, at: int) -> Response | Stream:
        steps = self.steps
        for i in range(at, len(steps)):
            answer = await steps[i].run(call)
            if answer is not None:
                return answer
        return await self.proxy.forward(call)

    def _go_on(self, ex: Exchange) -> None:
        ex.call.request.resume(self._proxy(ex.call, begun=ex))

    # ------------------------------------------------------------ routes

    async def handle(self, request: Request) -> Response | Stream:
        path, method = request.path, request.method
        if path in ROUTED:
            if method == b"POST":
                return await self._proxy(Call(request))
            return errors.method_not_allowed(method.decode(), "POST")
        if path.startswith(_RESPONSE_PREFIX):
            return await self._stored_response(request)
        if path in _GET_ROUTES or path.startswith(_MODEL_PREFIX):
            if method != b"GET" and method != b"HEAD":
                return errors.method_not_allowed(method.decode(), "GET")
            if path == b"/healthz":
                return self._healthz()
            if path == b"/metrics":
                return Response(200, b"Content-Type: %s\r\n" % self.metrics.content_type.encode(),
                                self.metrics.render())
            call = Call(request)
            if self.authenticate is not None:
                denied = await self.authenticate.run(call)
                if denied is not None:
                    return denied
            if path == _MODELS:
                return self._models(call)
            return self._model(unquote(path[len(_MODEL_PREFIX):].decode("utf-8", "replace")), call)
        return errors.not_found(path.decode("latin-1"))

    async def _stored_response(self, request: Request) -> Response | Stream:
        """A stored response retrieved (GET) or cancelled (POST .../cancel) at the replica that
        holds it, for a caller who may call its model; no limits (nothing is generated)."""
        path, method = request.path, request.method
        cancel = path.endswith(_CANCEL)
        allowed = b"POST" if cancel else b"GET"
        if method != allowed:
            return errors.method_not_allowed(method.decode(), allowed.decode())
        response_id = unquote(path[len(_RESPONSE_PREFIX):len(path) - len(_CANCEL) * cancel].decode("utf-8", "replace"))
        call = Call(request)
        if self.authenticate is not None:
            denied = await self.authenticate.run(call)
            if denied is not None:
                return denied
        found = home(response_id)
        if found is None:
            return errors.response_unknown(response_id)
        engine_id, replica = found
        b = self.table.backends.get(replica)
        if b is None:
            return errors.response_gone(response_id, replica, "response_id")
        if not self.scope.allows(call.key, b.model):
            return errors.response_unknown(response_id)
        query = request.target[len(path):]
        request.target = _RESPONSE_PREFIX + quote(engine_id).encode() + _CANCEL * cancel + query
        call.body, call.name, call.model, call.pinned = Body(b"", {}), b.served[0] if b.served else b.model, \
            b.model, replica
        return await self._proxy(call, len(self.steps))

    def _models(self, call: Call) -> Response:
        data = []
        for model, aliases, created in self.table.routable_models():
            if not self.scope.allows(call.key, model):
                continue
            endpoints = endpoints_of(self.table.backends_for(model))
            data.append(_model_card(model, model, created, aliases, endpoints))
            data.extend(_model_card(a, model, created, (), endpoints) for a in aliases)
        data.extend(_model_card(adapter, base, created, (), endpoints_of(self.table.backends_for(base)), parent=base)
                    for adapter, base, created in self.table.routable_adapters()
                    if self.scope.allows(call.key, adapter))
        return json_response({"object": "list", "data": data})

    def _model(self, name: str, call: Call) -> Response:
        for model, aliases, created in self.table.routable_models():
            if (name == model or name in aliases) and self.scope.allows(call.key, model):
                return json_response(_model_card(name, model, created, aliases if name == model else (),
                                                 endpoints_of(self.table.backends_for(model))))
        for adapter, base, created in self.table.routable_adapters():
            if name == adapter and self.scope.allows(call.key, adapter):
                endpoints = endpoints_of(self.table.backends_for(base))
                return json_response(_model_card(adapter, base, created, (), endpoints, parent=base))
        return errors.model_not_found(name, self.scope.known(call.key))

    def _healthz(self) -> Response:
        body = {
            "status": "ok" if self.synced else "syncing",
            "models": len(self.table.models),
            "routableReplicas": len(self.table.backends),
        }
        return json_response(body, status=200 if self.synced else 503)


def _model_card(id_: str, root: str, created: int, aliases: Sequence[str], endpoints: list[str],
                parent: str | None = None) -> dict[str, Any]:
    """An OpenAI model card, with the endpoints its replicas serve; a LoRA adapter's names its base
    as `parent`, as vLLM's does."""
    card: dict[str, Any] = {"id": id_, "object": "model", "created": created, "owned_by": "llmgw", "root": root,
                            "endpoints": endpoints}
    if aliases:
        card["aliases"] = list(aliases)
    if parent is not None:
        card["parent"] = parent
    return card
