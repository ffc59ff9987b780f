"""The REST API of `llmgw server` (docs/contracts.md, "REST") on top of llmgw.store: its routes,
each to the handler of its resource (llmgw/server/handlers/), and the pipeline every request goes
through, in Kubernetes' order (the middlewares of ``ApiServer.app``, then the handler):

1. errors: whatever a later step raises becomes one JSON Status answer, here and nowhere else
   (`_errors`): the contract's errors (llmgw.api.errors) with their code, reason and details, and
   a path or a method the API does not have too (404, 405);
2. authenticate: the client certificate (401 when missing, expired, not yet valid, revoked),
   then an agent's, a gateway's or a controller-manager's version against the version skew
   policy (llmgw/version.py: 403 VersionSkew naming both versions, when its X-Llmgw-Version is
   outside it; one that sends none is taken for 0.1.0, the last release that sent none: HEADERLESS);
3. authorize by the URL: the verb (the route and method), the kind (404 when unknown) and the
   names the URL holds (the path's, ``?node=``, the events' ``?kind=&name=``), which must be
   names (400: none reaches a store key or a log line as it came), before the body is read (403);
4. the handler: reads the body (415 unless its content-type is what the method takes, 413,
   400), decodes and validates it (422) (llmgw/server/request.py), authorizes again with what the
   body says (the name created, the fields written, the stored shard's node), then calls the store.

Both authorizations are one step, ``ApiServer.authorize``: the rules of llmgw/server/authz.py
against the request's identity, every refusal logged. With an audit log (llmgw/server/audit.py),
every request that changes state and every refusal that its policy keeps is a line of it, written
after its answer.
"""
from __future__ import annotations

import asyncio
import json
import logging
import operator
import ssl
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from typing import Any, NamedTuple

from aiohttp import web

from llmgw.api import KINDS, Shard
from llmgw.api.errors import (
    BadRequest,
    CertificateExpired,
    CertificateNotYetValid,
    CertificateRevoked,
    StatusError,
    Unauthorized,
    VersionSkew,
)
from llmgw.api.limits import HEARTBEAT_TTL, MAX_BODY_BYTES
from llmgw.api.selectors import Selector
from llmgw.pki import CertificateAuthority, Identity, identity_from_der
from llmgw.pki.signer import Signer
from llmgw.server.audit import AuditLog
from llmgw.server.authz import Action, Authorizer, Denied
from llmgw.server.handlers.access import Access
from llmgw.server.handlers.demand import Demand
from llmgw.server.handlers.events import Events
from llmgw.server.handlers.heartbeat import Heartbeats
from llmgw.server.handlers.logs import Logs
from llmgw.server.handlers.objects import Objects
from llmgw.server.handlers.renewals import Renewals, TokenBucket
from llmgw.server.handlers.revocations import Revoke
from llmgw.server.handlers.status import StatusWrites
from llmgw.server.handlers.watch import Watches
from llmgw.server.handlers.weights import WeightsQuery
from llmgw.server.logs import AgentLogs
from llmgw.server.metrics import ServerMetrics
from llmgw.server.rbac import Bindings
from llmgw.server.request import HIDE_KEY_HASHES, json_response, kind_of, unknown_kind, url_name, watching
from llmgw.server.revocations import Revocations
from llmgw.server.status import status_body
from llmgw.server.watchcache import WatchCache
from llmgw.server.weightsindex import WeightsIndex
from llmgw.store import Store
from llmgw.version import HEADER, HEADERLESS, OLDER, refusal, version

log = logging.getLogger("llmgw.server")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
API = "/apis/llmgw.io/v1"
class Route(NamedTuple):
    method: str
    path: str
    handler: str        # the ApiServer's attribute that answers it
    verb: str
    kind: str = ""      # what it is counted and audited under, where its path names no kind
    open: bool = False  # no rule is asked: anyone may, or its handler decides who


ROUTES = [
    Route("POST", "/heartbeat/{node}", "heartbeats.beat", "heartbeat", "heartbeat"),
    Route("GET", "/heartbeat/{node}", "heartbeats.stream", "heartbeat", "heartbeat"),   # a WebSocket of beats
    Route("POST", "/demand/{gateway}", "demand.report", "demand", "demand"),
    Route("DELETE", "/demand/{gateway}", "demand.withdraw", "demand", "demand"),   # before {kind}/{name}
    Route("GET", "/events", "list_events", "events-read", "events"),
    Route("POST", "/events", "events.record", "events-write", "events"),
    Route("POST", "/revocations", "revoke.revoke", "revoke", "revocations"),
    # the revocation list, a renewal of one's own certificate (what it may ask, the signer says:
    # handlers/renewals.py), the renewals (admins: the handler), who am I, may I, versions, members
    Route("GET", "/revocations", "list_revocations", "revocations-read", "revocations", open=True),
    Route("POST", "/renewals", "renewals.renew", "renew", "renewals", open=True),
    Route("GET", "/renewals", "renewals.list", "renewals-read", "renewals", open=True),
    Route("GET", "/whoami", "access.whoami", "whoami", "whoami", open=True),
    Route("POST", "/accessreviews", "access.review", "review", "accessreviews", open=True),
    Route("GET", "/versions", "demand.versions", "versions", "versions", open=True),   # before {kind}
    Route("GET", "/members", "demand.members", "members", "members", open=True),
    Route("GET", "/usage/{kind}", "demand.list_usage", "list"),   # before {kind}/{name}, which it would match
    Route("GET", "/usage/{kind}/{name}", "demand.get_usage", "get"),
    Route("GET", "/{kind}", "list_or_watch", "list"),   # "watch" with ?watch=1
    Route("POST", "/{kind}", "objects.create", "create"),
    Route("GET", "/{kind}/{name}", "objects.get", "get"),
    Route("PUT", "/{kind}/{name}", "objects.update", "update"),
    Route("DELETE", "/{kind}/{name}", "objects.delete", "delete"),
    Route("PUT", "/{kind}/{name}/status", "status.update", "status"),
    Route("PATCH", "/{kind}/{name}/status", "status.patch", "status"),
    Route("POST", "/{kind}/{name}/apply", "objects.apply", "apply"),
    Route("GET", "/{kind}/{name}/log", "logs.log", "log"),
]
PSEUDO_KINDS = {r.verb: r.kind for r in ROUTES if r.kind}
OPEN_VERBS = frozenset(r.verb for r in ROUTES if r.open)
VERBS = frozenset({r.verb for r in ROUTES} | {"watch"})   # an audit line's, "-" but
AUDIT_KINDS = frozenset(KINDS) | frozenset(PSEUDO_KINDS.values())


def _written(resp: web.StreamResponse) -> dict[str, Any]:
    """The object a write answered with (an apply's is under "object"), or {}."""
    body = resp.body if isinstance(resp, web.Response) else None
    if not isinstance(body, bytes):
        return {}
    try:
        doc = json.loads(body)
    except ValueError:
        return {}
    obj = doc.get("object", doc) if isinstance(doc, dict) else None
    return obj if isinstance(obj, dict) else {}


def _answer(err: StatusError, headers: dict[str, str] | None = None) -> web.Response:
    return json_response(status_body(err.code, err.reason, str(err), **err.details), err.code, headers)


class ApiServer:
    def __init__(self, store: Store, bookmark_interval: float = 10.0, watch_cache_size: int = 10000,
                 watch_queue_limit: int = 1000, agent_tls: ssl.SSLContext | None = None,
                 revocation_journal: CertificateAuthority | None = None, audit: AuditLog | None = None,
                 signer: Signer | None = None, renewal_rate: float = 20.0, renewal_burst: int = 50,
                 heartbeat_ttl: int = HEARTBEAT_TTL):
        self.store = store
        self.audit = audit
        self.watch_cache = WatchCache(store, size=watch_cache_size, queue_limit=watch_queue_limit)
        self.weights_index = WeightsIndex(store)
        # the journal checked at start and after each relist (etcd restored under the server)
        self.revocations = Revocations(store, journal=revocation_journal)
        self.bindings = Bindings(store)
        self.authz = Authorizer(self._referenced, self.bindings)
        self.agent_logs = AgentLogs(agent_tls, lambda serial: serial in self.revocations)
        self.metrics = ServerMetrics()
        if audit is not None:
            self.metrics.audit(audit)
        self._identities: OrderedDict[bytes, Identity] = OrderedDict()
        self._tasks: list[asyncio.Task[None]] = []
        # the handlers, by resource; each route's verb, as the authorizer knows it
        self.objects = Objects(store, self.authorize)
        self.status = StatusWrites(store, self.authorize)
        self.watches = Watches(store, self.watch_cache, self.revocations, self.metrics, bookmark_interval)
        self.weights = WeightsQuery(self.weights_index)
        self.logs = Logs(store, self.authorize, self.agent_logs)
        self.events = Events(store, self.authorize)
        self.heartbeats = Heartbeats(store, self.revocations, self.metrics, heartbeat_ttl)
        self.demand = Demand(store)
        self.revoke = Revoke(store, self.authorize)
        self.renewals = Renewals(store, signer, TokenBucket(renewal_rate, renewal_burst))
        self.access = Access(store, self.authz)
        self._verbs: dict[object, str] = {}   # by handler

    # ------------------------------------------------------------ app
    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._count, self._audit, self._errors, self._authenticate,
                                           self._authorize],
                              client_max_size=MAX_BODY_BYTES)
        app.router.add_get("/healthz", self.healthz)
        for route in ROUTES:
            handler: Handler = operator.attrgetter(route.handler)(self)
            if route.method == "GET":
                app.router.add_get(API + route.path, handler)   # and HEAD
            else:
                app.router.add_route(route.method, API + route.path, handler)
            self._verbs[handler] = route.verb
        app.on_startup.append(self._start)
        app.on_shutdown.append(self._drain)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, app: web.Application) -> None:
        self._tasks.append(asyncio.create_task(self.revocations.run()))
        await asyncio.wait_for(self.revocations.ready.wait(), 30)  # never serve before revocations are known
        await asyncio.wait_for(self.bindings.run(), 30)   # nor before the roles and their bindings are

    async def _drain(self, app: web.Application) -> None:
        """Once the server stops accepting (the runner's cleanup), before it waits for the requests
        in flight: its watches end at once (Watches.drain), so they are not what it waits for."""
        self.watches.drain()
        await self.heartbeats.drain()

    async def _stop(self, app: web.Application) -> None:
        await self.watch_cache.stop()
        await self.weights_index.stop()
        await self.heartbeats.stop()
        await self.agent_logs.close()
        await self.bindings.stop()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _verb(self, request: web.Request) -> str | None:
        """The verb a request's route and method are, as the authorizer names it (None: no route, /healthz)."""
        verb = self._verbs.get(getattr(request.match_info.route, "handler", None))
        if verb == "list" and watching(request):
            return "watch"
        return verb

    # ------------------------------------------------------------ middlewares
    @web.middleware
    async def _count(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Every answer counted by verb, kind and code (a watch when it ends)."""
        code = 500
        try:
            resp = await handler(request)
            code = resp.status
            return resp
        except web.HTTPException as err:
            code = err.status
            raise
        finally:
            verb, kind = self._what(request)
            self.metrics.observe(verb, kind, code)

    def _what(self, request: web.Request) -> tuple[str, str]:
        """The verb and kind a request is counted under (unknown paths: "-")."""
        verb = self._verb(request) or "-"
        kind = request.match_info.get("kind", "")
        if kind not in KINDS:
            kind = PSEUDO_KINDS.get(verb, "-")
        return verb, kind

    @web.middleware
    async def _audit(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """A request that changes state (but a node's heartbeat, a gateway's demand report) and every
        refusal, as one audit line once it is answered (every refusal is an answer: `_errors`)."""
        resp = await handler(request)
        if self.audit is None:
            return resp
        verb, kind = self._what(request)
        who: Identity | None = request.get("identity")
        if (resp.status in (401, 403) or (request.method not in ("GET", "HEAD")
                                          and verb not in ("heartbeat", "demand", "review", "-"))) \
                and self.audit.logs(who.name if who else None, who.all_groups if who else (), verb, kind):
            self.audit.record(self._audit_line(request, resp, verb, kind))
        return resp

    def _audit_line(self, request: web.Request, resp: web.StreamResponse, verb: str, kind: str) -> dict[str, object]:
        who: Identity | None = request.get("identity")
        written = _written(resp) if resp.status < 300 else {}
        meta = written.get("metadata") or {}
        request_id = uuid.uuid4().hex
        if not resp.prepared:
            resp.headers["X-Request-Id"] = request_id
        return {"time": datetime.now(timezone.utc).isoformat(timespec="milliseconds"), "requestId": request_id,
                "user": who.name if who else None, "groups": list(who.all_groups) if who else [],
                "verb": verb, "kind": kind, "name": request.match_info.get("name") or meta.get("name"),
                "code": resp.status, "revision": meta.get("resourceVersion")}

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Step 1: every refusal answered as a Status, here alone."""
        try:
            return await handler(request)
        except StatusError as err:   # the contract's: the server's own refusals, the store's errors
            return _answer(err)
        except web.HTTPException as err:
            if err.status < 400:
                raise
            # the router's 404 (no such path) and 405 (no such method), as a Status like every other
            # refusal; the 405's Allow header is kept
            allow = {"Allow": err.headers["Allow"]} if "Allow" in err.headers else None
            return json_response(status_body(err.status, "".join(err.reason.split()),
                                             f"{request.method} {request.path}: {err.reason}"), err.status, allow)
        except ValueError as err:   # what a parser refuses (a label selector, a log query, ...)
            return _answer(BadRequest(str(err)))

    def _identity(self, der: bytes) -> Identity:
        ident = self._identities.get(der)
        if ident is None:
            ident = identity_from_der(der)
            self._identities[der] = ident
            if len(self._identities) > 4096:
                self._identities.popitem(last=False)
        return ident

    @web.middleware
    async def _authenticate(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Step 2: the client certificate, as an Identity (request["identity"])."""
        ssl_obj = request.transport.get_extra_info("ssl_object") if request.transport else None
        der = ssl_obj.getpeercert(binary_form=True) if ssl_obj else None
        if not der:
            raise Unauthorized("a client certificate is required")
        who = self._identity(der)
        peer = request.remote
        if who.expired():
            log.warning("refused: certificate %s from %s expired at %s", who, peer, who.not_after.isoformat())
            raise CertificateExpired(f"client certificate {who} expired at {who.not_after.isoformat()}; "
                                     "issue a new one with `llmgw ca issue`")
        if who.not_yet_valid():
            log.warning("refused: certificate %s from %s is not valid before %s", who, peer, who.not_before.isoformat())
            raise CertificateNotYetValid(f"client certificate {who} is not valid before "
                                         f"{who.not_before.isoformat()} (check the clocks)")
        if who.serial in self.revocations:
            log.warning("refused: certificate %s from %s is revoked", who, peer)
            raise CertificateRevoked(f"client certificate {who} is revoked; ask an admin for a new one")
        request["identity"] = who
        component = "agent" if who.role == "node" else who.name if who.role == "component" else None
        if component in OLDER:
            why = refusal(component, request.headers.get(HEADER, HEADERLESS), version())
            if why is not None:
                log.warning("refused: %s from %s: %s", who, peer, why)
                raise VersionSkew(why)
        return await handler(request)

    @web.middleware
    async def _authorize(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Step 3: the verb, the kind and the URL's names against the identity, before any body is read."""
        act = self._url_action(request)
        if act is not None:
            await self.authorize(request, act)
            request[HIDE_KEY_HASHES] = act.kind == "apikeys" and self.authz.hides_key_hashes(request["identity"])
        return await handler(request)

    def _url_action(self, request: web.Request) -> Action | None:
        """What the URL asks to do, with what only the body can say left unknown; None: anyone may.
        Its names are checked here (400 for one that is not a name), before any rule reads them."""
        verb = self._verb(request)
        if verb is None or verb in OPEN_VERBS:   # /healthz, an open route, or no route: 404/405 for all alike
            return None
        q, info = request.query, request.match_info
        if verb == "heartbeat":
            return Action(verb, "heartbeat", url_name("node", info["node"]), final=False)
        if verb == "demand":
            return Action(verb, "demand", url_name("gateway", info["gateway"]), final=False)
        if verb == "events-read":   # every object's, ?kind=K's, or ?kind=K&name=N's
            kind, name = q.get("kind") or None, q.get("name") or None
            if name is not None and kind is None:
                raise BadRequest("name: the events of a name need ?kind= too")
            if kind is not None and kind not in KINDS:
                raise BadRequest(f"kind: {unknown_kind(kind)}")
            about = "/".join(p for p in (kind, name and url_name("name", name)) if p) or None
            return Action(verb, "events", about, final=False)
        if verb in ("events-write", "revoke"):
            return Action(verb, "revocations" if verb == "revoke" else "events", final=False)
        kind = kind_of(request)
        node = url_name("node", q["node"]) if q.get("node") else None
        name = url_name("name", info["name"]) if "name" in info else None
        return Action(verb, kind, name, node=node, final=False, weights=verb == "list" and "weights" in q)

    async def authorize(self, request: web.Request, act: Action) -> None:
        """The one authorization step, by the URL (step 3) and by the object (step 4): the rules
        (llmgw/server/authz.py) judge the request's identity; a refusal (403) is logged: who, the
        rule, the object."""
        try:
            await self.authz.check(request["identity"], act)
        except Denied as d:
            if d.log_line:
                log.warning("%s (%s: rule %s)", d.log_line, d.action, d.rule)
            else:
                log.warning("refused: certificate %s: %s: %s", request["identity"], d.action, d)
            raise

    async def _referenced(self, node: str) -> tuple[set[str], set[str]]:
        shards, _ = await self.store.list(Shard, node=node)
        return {s.spec.model for s in shards}, {s.spec.replica for s in shards}

    # ------------------------------------------------------------ routes answered by more than one handler
    async def healthz(self, request: web.Request) -> web.Response:
        return json_response({"status": "ok", "identity": str(request["identity"]), "version": version()})

    async def list_or_watch(self, request: web.Request) -> web.StreamResponse:
        """GET /{kind}: the Nodes that hold some weights (?weights=), a watch (?watch=1), or a list."""
        kind = kind_of(request)
        selector = request.query.get("labelSelector") or None
        if selector:
            Selector.parse(selector)  # 400 on a bad selector before anything else
        if "weights" in request.query:
            return await self.weights.nodes(request, kind)
        if watching(request):
            return await self.watches.objects(request, kind)
        return await self.objects.list(request, kind)

    async def list_revocations(self, request: web.Request) -> web.StreamResponse:
        """GET /revocations: the revoked serials, or with ?watch=1 their stream."""
        if watching(request):
            return await self.watches.revoked(request)
        return await self.revoke.list(request)

    async def list_events(self, request: web.Request) -> web.StreamResponse:
        """GET /events: their list, or with ?watch=1 their stream."""
        if watching(request):
            return await self.watches.events(request)
        return await self.events.list(request)
