"""The REST API of `llmgw server` (docs/contracts.md, "REST") on top of llmgw.store.

Every request goes through one pipeline, in Kubernetes' order (the middlewares of
``ApiServer.app``, then the handler):

1. errors: whatever a later step raises becomes one JSON Status answer (a path or a method
   the API does not have too: 404, 405);
2. authenticate: the client certificate (401 when missing, expired, not yet valid, revoked);
3. authorize by the URL: the verb (the route and method), the kind (404 when unknown) and the
   names the URL holds (the path's, ``?node=``, the events' ``?kind=&name=``), which must be
   names (400: none reaches a store key or a log line as it came), before the body is read (403);
4. the handler: reads the body (415 unless its content-type is what the method takes, 413,
   400), decodes and validates it (422), authorizes again with what the body says (the name
   created, the fields written, the stored shard's node), then calls the store.
"""
from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from llmgw.api import KINDS, AnyObject, InvalidObject, parse_object
from llmgw.api.applied import applied, applies_nothing, check_not_owned
from llmgw.api.demand import DemandReport
from llmgw.api.errors import AlreadyExists, Conflict, Expired, NotFound, StatusError
from llmgw.api.limits import INT64, MAX_BODY_BYTES, InputError, parse_json, too_large
from llmgw.api.logs import LogQuery, parse_rank
from llmgw.api.manifests import describe_validation_error
from llmgw.api.meta import check_dns1123_label
from llmgw.api.selectors import Selector
from llmgw.api.sources import check_digest
from llmgw.api.types import ApiKey, Node, Replica, Shard, node_of
from llmgw.api.usage import KeyUsage, UsageReport, total_usage
from llmgw.api.wellknown import REPLICA_LABEL, shard_name
from llmgw.pki import CAError, Identity, identity_from_der, normalize_serial
from llmgw.server.authz import Action, Authorizer, Denied, written_fields
from llmgw.server.events import EventWatch
from llmgw.server.logs import AgentLogs
from llmgw.server.metrics import ServerMetrics
from llmgw.server.revocations import Revocations
from llmgw.server.status import status_body
from llmgw.server.watchcache import WatchCache, check_revision, error_line, event_line
from llmgw.server.weightsindex import WeightsIndex
from llmgw.store import Store

log = logging.getLogger("llmgw.server")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
API = "/apis/llmgw.io/v1"
# The content-types a body may have: an object is JSON; a status PATCH is a JSON merge patch
# (RFC 7386), which the client sends as application/json, so a PATCH takes both.
JSON = "application/json"
BODY_TYPES = {"PATCH": (JSON, "application/merge-patch+json")}

# A handler's verb, as the authorizer knows it (list_or_watch is "watch" with ?watch=1).
EVENT_FIELDS = ("kind", "name", "type", "reason", "message")
_VERBS = {"list_or_watch": "list", "get": "get", "create": "create", "update": "update", "delete": "delete",
          "update_status": "status", "patch_status": "status", "apply": "apply", "heartbeat": "heartbeat",
          "report_demand": "demand", "list_usage": "list", "get_usage": "get",
          "list_events": "events-read", "record_event": "events-write", "revoke": "revoke", "log": "log"}


def _watching(request: web.Request) -> bool:
    return request.query.get("watch") in ("1", "true")


def _verb(request: web.Request) -> str | None:
    """The verb a request's route and method are, as the authorizer names it (None: no route, /healthz)."""
    verb = _VERBS.get(getattr(getattr(request.match_info.route, "handler", None), "__name__", ""))
    if verb == "list" and _watching(request):
        return "watch"
    return verb


class Fail(Exception):
    def __init__(self, code: int, reason: str, message: str, **details: Any) -> None:
        self.code, self.reason, self.message, self.details = code, reason, message, details
        super().__init__(message)


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(text=json.dumps(data), status=status, headers=headers, content_type=JSON)


def _not_a_name(value: str) -> str | None:
    """Why `value` is not an object's name (every kind's names are DNS-1123 labels); None if it is one."""
    try:
        check_dns1123_label(value)
    except ValueError as err:
        return str(err)
    return None


def _url_name(field: str, value: str) -> str:
    """A name the URL holds: itself, or a 400 naming the field."""
    why = _not_a_name(value)
    if why is not None:
        raise Fail(400, "BadRequest", f"{field}: {why}")
    return value


def _weights_refs(kind: str, request: web.Request) -> list[str]:
    """`?weights=SOURCE[&digest=sha256:...]` (llmgw/server/weightsindex.py): what it asks for, or 400."""
    q = request.query
    if kind != "nodes" or _watching(request) or {"labelSelector", "node"} & q.keys():
        raise Fail(400, "BadRequest", "weights: lists Nodes only, without watch, labelSelector or node")
    source, digest = q["weights"], q.get("digest")
    if not source:
        raise Fail(400, "BadRequest", "weights: a model's source, not empty")
    if digest is not None:
        try:
            check_digest(digest[:80])
        except ValueError as err:
            raise Fail(400, "BadRequest", f"digest: {err}") from None
    return [source] if digest is None else [source, digest]


def _resource_version(query: Mapping[str, str]) -> int:
    """A watch's ?resourceVersion=: the revision it resumes after (0: none, list first)."""
    asked = query.get("resourceVersion", "")
    try:
        rv = int(asked) if asked else 0
    except ValueError:
        rv = -1
    if not 0 <= rv <= INT64[1]:
        raise Fail(400, "BadRequest", f"resourceVersion must be a revision (an integer >= 0), got {asked[:40]!r}")
    return rv


def _unknown_kind(kind: object) -> str:
    return f"unknown kind {kind!r} (known: {', '.join(KINDS)})"


def _dump(obj: AnyObject) -> dict[str, Any]:
    dumped: dict[str, Any] = obj.model_dump(mode="json")
    return dumped




class ApiServer:
    def __init__(self, store: Store, bookmark_interval: float = 10.0, watch_cache_size: int = 10000,
                 watch_queue_limit: int = 1000, agent_tls: ssl.SSLContext | None = None):
        self.store = store
        self.bookmark_interval = bookmark_interval
        self.watch_cache = WatchCache(store, size=watch_cache_size, queue_limit=watch_queue_limit)
        self.weights_index = WeightsIndex(store)
        self.revocations = Revocations(store)
        self.authz = Authorizer(self._referenced)
        self.agent_logs = AgentLogs(agent_tls, lambda serial: serial in self.revocations)
        self.metrics = ServerMetrics()
        self._identities: OrderedDict[bytes, Identity] = OrderedDict()
        self._tasks: list[asyncio.Task[None]] = []

    # ------------------------------------------------------------ app
    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._count, self._errors, self._authenticate, self._authorize],
                              client_max_size=MAX_BODY_BYTES)
        r = app.router
        r.add_get("/healthz", self.healthz)
        r.add_post(f"{API}/heartbeat/{{node}}", self.heartbeat)
        r.add_post(f"{API}/demand/{{gateway}}", self.report_demand)
        r.add_get(f"{API}/events", self.list_events)
        r.add_post(f"{API}/events", self.record_event)
        r.add_post(f"{API}/revocations", self.revoke)
        r.add_get(f"{API}/usage/{{kind}}", self.list_usage)   # before {kind}/{name}, which it would match
        r.add_get(f"{API}/usage/{{kind}}/{{name}}", self.get_usage)
        r.add_get(f"{API}/{{kind}}", self.list_or_watch)
        r.add_post(f"{API}/{{kind}}", self.create)
        r.add_get(f"{API}/{{kind}}/{{name}}", self.get)
        r.add_put(f"{API}/{{kind}}/{{name}}", self.update)
        r.add_delete(f"{API}/{{kind}}/{{name}}", self.delete)
        r.add_put(f"{API}/{{kind}}/{{name}}/status", self.update_status)
        r.add_patch(f"{API}/{{kind}}/{{name}}/status", self.patch_status)
        r.add_post(f"{API}/{{kind}}/{{name}}/apply", self.apply)
        r.add_get(f"{API}/{{kind}}/{{name}}/log", self.log)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, app: web.Application) -> None:
        self._tasks.append(asyncio.create_task(self.revocations.run()))
        await asyncio.wait_for(self.revocations.ready.wait(), 30)  # never serve before revocations are known

    async def _stop(self, app: web.Application) -> None:
        await self.watch_cache.stop()
        await self.weights_index.stop()
        await self.agent_logs.close()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

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

    @staticmethod
    def _what(request: web.Request) -> tuple[str, str]:
        """The verb and kind a request is counted under (unknown paths: "-")."""
        verb = _verb(request) or "-"
        kind = request.match_info.get("kind", "")
        if kind not in KINDS:
            kind = {"heartbeat": "heartbeat", "events-read": "events", "events-write": "events",
                    "revoke": "revocations", "demand": "demand"}.get(verb, "-")
        return verb, kind

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except Fail as f:
            return _json(status_body(f.code, f.reason, f.message, **f.details), f.code)
        except Denied as d:
            who = request.get("identity")
            # every refusal: who, the rule, the object
            if d.log_line:
                log.warning("%s (%s: rule %s)", d.log_line, d.action, d.rule)
            else:
                log.warning("refused: certificate %s: %s: %s", who, d.action, d)
            return _json(status_body(403, "Forbidden", str(d), rule=d.rule), 403)
        except InvalidObject as err:
            return _json(status_body(422, "Invalid", "; ".join(err.problems)), 422)
        except web.HTTPException as err:
            if err.status < 400:
                raise
            # the router's 404 (no such path) and 405 (no such method), as a Status like every other
            # refusal; the 405's Allow header is kept
            allow = {"Allow": err.headers["Allow"]} if "Allow" in err.headers else None
            return _json(status_body(err.status, "".join(err.reason.split()),
                                     f"{request.method} {request.path}: {err.reason}"), err.status, allow)
        except StatusError as err:   # the store's errors carry the answer's code and reason
            return _json(status_body(err.code, err.reason, str(err)), err.code)
        except ValueError as err:
            return _json(status_body(400, "BadRequest", str(err)), 400)

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
        ssl_obj = request.transport.get_extra_info("ssl_object") if request.transport else None
        der = ssl_obj.getpeercert(binary_form=True) if ssl_obj else None
        if not der:
            raise Fail(401, "Unauthorized", "a client certificate is required")
        who = self._identity(der)
        peer = request.remote
        if who.expired():
            log.warning("refused: certificate %s from %s expired at %s", who, peer, who.not_after.isoformat())
            raise Fail(401, "CertificateExpired", f"client certificate {who} expired at {who.not_after.isoformat()}; "
                       "issue a new one with `llmgw ca issue`")
        if who.not_yet_valid():
            log.warning("refused: certificate %s from %s is not valid before %s", who, peer, who.not_before.isoformat())
            raise Fail(401, "CertificateNotYetValid", f"client certificate {who} is not valid before "
                       f"{who.not_before.isoformat()} (check the clocks)")
        if who.serial in self.revocations:
            log.warning("refused: certificate %s from %s is revoked", who, peer)
            raise Fail(401, "CertificateRevoked", f"client certificate {who} is revoked; ask an admin for a new one")
        request["identity"] = who
        return await handler(request)

    @web.middleware
    async def _authorize(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Step 3: the verb, the kind and the URL's names against the identity, before any body is read."""
        act = self._url_action(request)
        if act is not None:
            await self._check(request, act)
        return await handler(request)

    def _url_action(self, request: web.Request) -> Action | None:
        """What the URL asks to do, with what only the body can say left unknown; None: anyone may.
        Its names are checked here (400 for one that is not a name), before any rule reads them."""
        verb = _verb(request)
        if verb is None:
            return None   # /healthz, or no route: 404/405 for every identity alike
        q, info = request.query, request.match_info
        if verb == "heartbeat":
            return Action(verb, "heartbeat", _url_name("node", info["node"]), final=False)
        if verb == "demand":
            return Action(verb, "demand", _url_name("gateway", info["gateway"]), final=False)
        if verb == "events-read":   # every object's, ?kind=K's, or ?kind=K&name=N's
            kind, name = q.get("kind") or None, q.get("name") or None
            if name is not None and kind is None:
                raise Fail(400, "BadRequest", "name: the events of a name need ?kind= too")
            if kind is not None and kind not in KINDS:
                raise Fail(400, "BadRequest", f"kind: {_unknown_kind(kind)}")
            about = "/".join(p for p in (kind, name and _url_name("name", name)) if p) or None
            return Action(verb, "events", about, final=False)
        if verb in ("events-write", "revoke"):
            return Action(verb, "revocations" if verb == "revoke" else "events", final=False)
        kind = self._kind(request)
        node = _url_name("node", q["node"]) if q.get("node") else None
        name = _url_name("name", info["name"]) if "name" in info else None
        return Action(verb, kind, name, node=node, final=False)

    async def _check(self, request: web.Request, act: Action) -> None:
        await self.authz.check(request["identity"], act)

    async def _referenced(self, node: str) -> tuple[set[str], set[str]]:
        shards, _ = await self.store.list(Shard, node=node)
        return {s.spec.model for s in shards}, {s.spec.replica for s in shards}

    # ------------------------------------------------------------ helpers
    @staticmethod
    def _kind(request: web.Request) -> str:
        kind = request.match_info["kind"]
        if kind not in KINDS:
            raise Fail(404, "NotFound", _unknown_kind(kind))
        return kind

    @staticmethod
    async def _body(request: web.Request) -> dict[str, Any]:
        takes = BODY_TYPES.get(request.method, (JSON,))
        if request.content_type not in takes:
            raise Fail(415, "UnsupportedMediaType", f"request body: {request.method} takes {' or '.join(takes)}, "
                       f"not content-type {request.content_type!r}")
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise Fail(413, "RequestEntityTooLarge", f"request body: {too_large(MAX_BODY_BYTES)}") from None
        try:
            body = parse_json(raw)  # nesting, duplicate keys and size: llmgw.api.limits
        except InputError as err:
            raise Fail(400, "BadRequest", f"request body: {err}") from None
        except UnicodeDecodeError:
            raise Fail(400, "BadRequest", "request body is not valid JSON (not UTF-8)") from None
        except ValueError as err:
            raise Fail(400, "BadRequest", f"request body is not valid JSON: {err}") from None
        if not isinstance(body, dict):
            raise Fail(400, "BadRequest", "request body must be a JSON object")
        return body

    async def _object(self, request: web.Request, kind: str, require: str | None = None) -> AnyObject:
        """The body as an object of `kind`, named as the URL says; `require`: a field it must hold."""
        body = await self._body(request)
        if require is not None and require not in body:
            raise InvalidObject([f"{require}: Field required (this request writes it)"])
        obj = parse_object(body)
        if obj.kind_plural != kind:
            raise Fail(400, "BadRequest", f"body is a {obj.kind}, but the URL says {kind}")
        name = request.match_info.get("name")
        if name is not None and obj.metadata.name != name:
            raise Fail(400, "BadRequest", f"body names {obj.metadata.name!r}, but the URL says {name!r}")
        return obj

    # ------------------------------------------------------------ handlers
    async def healthz(self, request: web.Request) -> web.Response:
        return _json({"status": "ok", "identity": str(request["identity"])})

    async def list_or_watch(self, request: web.Request) -> web.StreamResponse:
        kind = self._kind(request)
        q = request.query
        node, selector = q.get("node") or None, q.get("labelSelector") or None
        if selector:
            Selector.parse(selector)  # 400 on a bad selector before anything else
        items: Sequence[AnyObject]
        if "weights" in q:
            items, rev = await self.weights_index.nodes(_weights_refs(kind, request))
        elif _watching(request):
            return await self._watch(request, kind, node, selector, _resource_version(q))
        else:
            items, rev = await self.store.list(KINDS[kind], selector=selector, node=node)
        return _json({"apiVersion": "llmgw.io/v1", "kind": f"{KINDS[kind].model_fields['kind'].default}List",
                      "metadata": {"resourceVersion": rev}, "items": [_dump(o) for o in items]})

    async def get(self, request: web.Request) -> web.Response:
        kind, name = self._kind(request), request.match_info["name"]
        hint = request.query.get("node") or None
        if KINDS[kind].scope == "Node":   # which node it is on is known once it is read
            obj = await self.store.get(KINDS[kind], name, node=hint)
            await self._check(request, Action("get", kind, name, node=hint, obj_node=node_of(obj)))
            return _json(_dump(obj))
        return _json(_dump(await self.store.get(KINDS[kind], name)))

    async def create(self, request: web.Request) -> web.Response:
        kind = self._kind(request)
        obj = await self._object(request, kind)
        await self._check(request, Action("create", kind, obj.name, obj_node=node_of(obj),
                                          fields=written_fields(obj)))
        return _json(_dump(await self.store.create(obj)), 201)

    async def update(self, request: web.Request) -> web.Response:
        kind = self._kind(request)
        obj = await self._object(request, kind)
        await self._check(request, Action("update", kind, obj.name, obj_node=node_of(obj)))
        if obj.metadata.resourceVersion is None:
            raise Fail(400, "BadRequest", "metadata.resourceVersion is required to update (get the object first)")
        return _json(_dump(await self.store.update(obj)))

    async def _existing_for_status(self, request: web.Request, kind: str, name: str,
                                   fields: Callable[[AnyObject], frozenset[str]]) -> AnyObject:
        """The object whose status is written, once the write is allowed; `fields(current)`: what it sets."""
        hint = request.query.get("node") or None
        current = await self.store.get(KINDS[kind], name, node=hint)
        await self._check(request, Action("status", kind, name, node=hint, obj_node=node_of(current),
                                          fields=fields(current)))
        return current

    async def update_status(self, request: web.Request) -> web.Response:
        kind = self._kind(request)
        obj = await self._object(request, kind, require="status")
        current = await self._existing_for_status(
            request, kind, obj.name, lambda cur: written_fields(cur.model_copy(update={"status": obj.status}), cur))
        new = current.model_copy(update={"status": obj.status})
        return _json(_dump(await self.store.update_status(new)))

    async def patch_status(self, request: web.Request) -> web.Response:
        kind, name = self._kind(request), request.match_info["name"]
        patch = await self._body(request)
        status_type = KINDS[kind].model_fields["status"].annotation
        assert status_type is not None  # every kind declares its status
        try:  # every status field has a default, so the patch alone says whether its fields are well typed
            status_type.model_validate(patch)
        except ValidationError as err:
            raise InvalidObject([f"status.{line}" for line in describe_validation_error(err)]) from None
        current = await self._existing_for_status(request, kind, name,
                                                  lambda cur: frozenset(f"status.{k}" for k in patch))
        return _json(_dump(await self.store.patch_status(KINDS[kind], name, patch, current=current)))

    async def delete(self, request: web.Request) -> web.Response:
        kind, name = self._kind(request), request.match_info["name"]
        return _json(_dump(await self.store.delete(KINDS[kind], name, node=request.query.get("node") or None)))

    async def apply(self, request: web.Request) -> web.Response:
        kind = self._kind(request)
        obj = await self._object(request, kind)
        await self._check(request, Action("apply", kind, obj.name, obj_node=node_of(obj)))
        result, out = await apply_object(self.store, obj)
        return _json({"result": result, "object": _dump(out)}, 201 if result == "created" else 200)

    async def heartbeat(self, request: web.Request) -> web.Response:
        node = request.match_info["node"]
        body = await self._body(request) if request.can_read_body else {}
        ttl = body.get("ttl")
        if ttl is None:   # absent or null: the default
            ttl = 15
        if not isinstance(ttl, int) or isinstance(ttl, bool) or not 1 <= ttl <= 600:
            raise Fail(400, "BadRequest", f"ttl must be an integer number of seconds in 1..600, got {ttl!r}")
        await self.store.get(Node, node)   # NotFound (404): a heartbeat is of a registered Node
        await self.store.heartbeats.beat(node, ttl=ttl)
        return _json({"node": node, "ttl": ttl})

    async def report_demand(self, request: web.Request) -> web.Response:
        """A gateway's demand report (docs/contracts.md, "Autoscaling"): kept under its lease."""
        gateway = request.match_info["gateway"]
        body = await self._body(request)
        ttl = body.pop("ttl", 15)
        if not isinstance(ttl, int) or isinstance(ttl, bool) or not 1 <= ttl <= 600:
            raise InvalidObject([f"ttl: must be an integer number of seconds in 1..600, got {ttl!r}"])
        keys = body.pop("keys", None)   # its API keys' usage, kept beside the demand (llmgw/api/usage.py)
        try:
            report = DemandReport.model_validate({"gateway": gateway, **body})
            usage = UsageReport.model_validate({"gateway": gateway, "keys": keys}) if keys is not None else None
        except ValidationError as err:
            raise InvalidObject(describe_validation_error(err)) from None
        await self.store.demand.report(report, ttl=ttl, usage=usage)
        # The live gateways, this one included: each enforces its share of an API key's limits.
        return _json({"gateway": gateway, "ttl": ttl, "gateways": len(await self.store.demand.list())})

    async def list_usage(self, request: web.Request) -> web.Response:
        """Every API key's usage summed over the live gateways' reports (llmgw/api/usage.py)."""
        return _json(await self._usage(request))

    async def get_usage(self, request: web.Request) -> web.Response:
        """One API key's usage summed over the live gateways; a key no gateway has seen: none."""
        name = request.match_info["name"]
        summed = await self._usage(request)
        await self.store.get(ApiKey, name)   # NotFound (404) for a key that does not exist
        return _json({"gateways": summed["gateways"], "name": name,
                      "usage": summed["keys"].get(name, KeyUsage().model_dump(mode="json"))})

    async def _usage(self, request: web.Request) -> dict[str, Any]:
        if request.match_info["kind"] != "apikeys":
            raise Fail(404, "NotFound", f"usage is kept for apikeys only, not {request.match_info['kind']}")
        reports = await self.store.demand.usage()
        return {"gateways": len(reports),
                "keys": {k: u.model_dump(mode="json") for k, u in sorted(total_usage(reports).items())}}

    async def log(self, request: web.Request) -> web.StreamResponse:
        """An engine's log, from the agent of the node that runs the shard (llmgw.server.logs):
        ``shards/<name>/log``, or ``replicas/<name>/log?rank=R`` (its shard of that rank, else the
        node its placement names)."""
        kind, name = self._kind(request), request.match_info["name"]
        try:
            query = LogQuery.parse(request.query)
        except ValueError as err:
            raise Fail(400, "BadRequest", str(err)) from None
        if kind == "shards":
            shard = await self.store.get(Shard, name, node=request.query.get("node") or None)
            shard_name, node = shard.name, shard.spec.node
        elif kind == "replicas":
            shard_name, node = await self._shard_of(name, request.query)
        else:
            raise Fail(404, "NotFound", f"{kind} have no log (replicas and shards do)")
        await self._check(request, Action("log", kind, name, obj_node=node))
        node_obj = await self.store.get(Node, node)
        async with self.agent_logs.open(node_obj, shard_name, query) as chunks:
            resp = web.StreamResponse(headers={"Content-Type": "text/plain; charset=utf-8",
                                               "Cache-Control": "no-cache"})
            await resp.prepare(request)
            await _relay(request, resp, chunks)
        return resp

    async def _shard_of(self, replica: str, query: Mapping[str, str]) -> tuple[str, str]:
        """A replica's shard of ?rank= and its node: the shard's, or the placement's while there is
        none (the log of the run before a rebuild stays on that node)."""
        try:
            rank = parse_rank(query)
        except ValueError as err:
            raise Fail(400, "BadRequest", str(err)) from None
        r = await self.store.get(Replica, replica)
        name = shard_name(replica, rank)
        shards, _ = await self.store.list(Shard, selector=f"{REPLICA_LABEL}={replica}")
        node = next((s.spec.node for s in shards if s.name == name),
                    next((p.node for p in r.spec.placement if p.rank == rank), None))
        if node is None:
            raise Fail(404, "NotFound", f"replica {replica} has no shard of rank {rank} and no placement: "
                       "no node holds its log now (`llmgw logs` the shard once it is placed)")
        return name, node

    async def list_events(self, request: web.Request) -> web.StreamResponse:
        """Every object's events, oldest first (or ?kind='s, or ?kind=&name='s), each with its kind,
        name and id, or with ?watch=1 their stream (llmgw.server.events)."""
        # ?kind= and ?name= were checked with the URL (_url_action)
        kind, name = request.query.get("kind") or None, request.query.get("name") or None
        if _watching(request):
            return await self._watch_events(request, kind, name, _resource_version(request.query))
        items, rev = await self.store.events.list_all(kind, name)
        return _json({"kind": "EventList", "metadata": {"resourceVersion": rev}, "items": items})

    async def record_event(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        for field in EVENT_FIELDS:
            if field not in body:
                raise Fail(400, "BadRequest", f"event field {field!r} is required")
        wrong = [f"{f}: must be a string" for f in (*EVENT_FIELDS, "node")
                 if f in body and not isinstance(body[f], str) and not (f == "node" and body[f] is None)]
        if wrong:
            raise InvalidObject(wrong)
        kind, name, type_, reason, message = (body[k] for k in EVENT_FIELDS)
        # what it is about: an object's kind and name (a name with '/' would file it under another's)
        about = [f"kind: {_unknown_kind(kind)}"] if kind not in KINDS else []
        about += [f"{f}: {why}" for f in ("name", "node") if body.get(f) is not None
                  and (why := _not_a_name(body[f])) is not None]
        if about:
            raise InvalidObject(about)
        obj_node = name if kind == "nodes" else None
        if KINDS[kind].scope == "Node" and request["identity"].role == "node":
            obj_node = node_of(await self.store.get(KINDS[kind], name, node=body.get("node")))
        await self._check(request, Action("events-write", "events", f"{kind}/{name}", obj_node=obj_node))
        await self.store.events.record(kind, name, type_, reason, message)
        return _json({"recorded": True}, 201)

    async def revoke(self, request: web.Request) -> web.Response:
        """Add a serial to the revoked ones (admins only); nothing in the API takes one off the list."""
        body = await self._body(request)
        try:
            serial = normalize_serial(str(body["serial"]))
        except KeyError:
            raise Fail(400, "BadRequest", "field 'serial' is required") from None
        except CAError as err:
            raise Fail(400, "BadRequest", f"serial: {err}") from None
        await self._check(request, Action("revoke", "revocations", serial))
        info = {"revokedAt": datetime.now(timezone.utc).isoformat(), "revokedBy": request["identity"].name}
        for field in ("role", "name"):   # what the CA's index says the certificate was, when it knows
            value = body.get(field)
            if value is not None:
                if not isinstance(value, str) or len(value) > 253:
                    raise Fail(400, "BadRequest", f"{field} must be a string of at most 253 characters")
                info[field] = value
        await self.store.revocations.add(serial, info)
        log.info("certificate serial=%s revoked by %s", serial, request["identity"])
        return _json({"serial": serial, **info}, 201)

    # ------------------------------------------------------------ watch
    async def _watch(self, request: web.Request, kind: str, node: str | None, selector: str | None,
                     rv: int) -> web.StreamResponse:
        """JSON lines: events after rv (rv=0: every current object as ADDED first), BOOKMARKs while
        idle, and one ERROR before the end (410 Expired: relist; 503 when the server stops:
        re-watch from the last revision; 401 when the client's certificate is revoked or
        expires while the watch is open: see _end_with_identity).

        Served by the shared watch cache (llmgw.server.watchcache): one store watch per kind,
        whatever the number of HTTP watches; while etcd is unreachable, the stream stays open
        (BOOKMARKs) and the cache resumes where it stopped."""
        if node is not None and KINDS[kind].scope != "Node":
            raise ValueError(f"kind {kind} is not keyed by node")
        sel = Selector.parse(selector) if selector else None
        cache = self.watch_cache.kind(kind)
        initial: list[AnyObject] = []
        expired: str | None = None
        if rv:
            try:
                current = await check_revision(self.store, rv)  # 410 if etcd compacted rv, as before
            except Expired as err:
                expired = str(err)
            else:
                cache.start(min(rv, current))
        else:
            initial, rv = await self.store.list(KINDS[kind], selector=selector, node=node)
            cache.start(rv)
        if expired is not None:
            return await self._serve_watch(request, kind, error_line(410, "Expired", expired), None)
        # no await since the revision check or the list: nothing can slip in between
        watcher = cache.subscribe(rv, node=node, selector=sel, who=f"{request['identity']} ({request.remote})")
        try:
            return await self._serve_watch(request, kind, b"".join(event_line("ADDED", _dump(o), rv) for o in initial),
                                           (watcher.stream(self.bookmark_interval), watcher.fail))
        finally:
            watcher.close()

    async def _watch_events(self, request: web.Request, kind: str | None, name: str | None,
                            rv: int) -> web.StreamResponse:
        """Events as an object watch streams objects (rv=0: the current ones as ADDED first)."""
        initial: list[dict[str, Any]] = []
        if rv:
            try:
                await check_revision(self.store, rv)
            except Expired as err:   # relist
                return await self._serve_watch(request, "events", error_line(410, "Expired", str(err)), None)
        else:
            initial, rv = await self.store.events.list_all(kind, name)
        watch = EventWatch(self.store, rv, kind, name, limit=self.watch_cache.queue_limit)
        return await self._serve_watch(request, "events", b"".join(event_line("ADDED", e, rv) for e in initial),
                                       (watch.stream(self.bookmark_interval), watch.fail))

    async def _serve_watch(self, request: web.Request, what: str, first: bytes,
                           then: tuple[AsyncIterator[bytes], Callable[[int, str, str], None]] | None,
                           ) -> web.StreamResponse:
        """A watch's answer: `first` (the current items as ADDED, or the ERROR that ends it), then the
        chunks of `then`'s stream until it ends or the client goes; its `fail` ends it with a 401 when
        the client's certificate is revoked or expires. Counted among the open watches of `what`."""
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson", "Cache-Control": "no-cache"})
        unbind = self._end_with_identity(then[1], request["identity"], what, request.remote) if then else None
        open_watches = self.metrics.watches.labels(what)
        open_watches.inc()
        try:
            await resp.prepare(request)
            if first:
                await resp.write(first)
            if then is not None:
                async for chunk in then[0]:
                    await resp.write(chunk)
        except (ConnectionResetError, ConnectionError):
            pass  # the client went away
        finally:
            open_watches.dec()
            if unbind is not None:
                unbind()
        return resp

    def _end_with_identity(self, fail: Callable[[int, str, str], None], who: Identity, kind: str,
                           peer: str | None) -> Callable[[], None]:
        """End a watch (through its `fail`) with a 401 ERROR and a log line when its certificate is
        revoked (the revocation watch calls back) or reaches notAfter (a timer). Returns the undo."""
        def end(reason: str, why: str) -> None:
            log.warning("watch of %s by certificate %s from %s ended: %s", kind, who, peer, why)
            fail(401, reason, f"client certificate {who} {why}")

        delay = (who.not_after - datetime.now(timezone.utc)).total_seconds()
        timer = asyncio.get_running_loop().call_later(
            max(delay, 0.0), end, "CertificateExpired",
            f"expired at {who.not_after.isoformat()}; issue a new one with `llmgw ca issue`")
        unsubscribe = self.revocations.on_revoke(
            who.serial, lambda: end("CertificateRevoked", "was revoked; ask an admin for a new one"))

        def undo() -> None:
            timer.cancel()
            unsubscribe()
        return undo


async def _relay(request: web.Request, resp: web.StreamResponse, chunks: AsyncIterator[bytes]) -> None:
    """Copy the agent's log to the client until it ends or the client goes (a followed log may be
    silent for long: the client's going is looked for every second)."""
    it = aiter(chunks)
    try:
        while True:
            nxt = asyncio.ensure_future(anext(it))
            while not nxt.done():
                await asyncio.wait({nxt}, timeout=1.0)
                if request.transport is None or request.transport.is_closing():
                    nxt.cancel()
                    return
            try:
                chunk = nxt.result()
            except StopAsyncIteration:
                return
            await resp.write(chunk)
    except ConnectionError:
        pass   # the client went away


async def apply_object(store: Store, obj: AnyObject, attempts: int = 10) -> tuple[str, AnyObject]:
    """Create `obj`, or make the stored one's spec, labels and annotations match it.

    Status is never written. Labels and annotations in the manifest are set; others the
    object carries (added by controllers or agents) are kept. An unchanged manifest writes
    nothing: generation and resourceVersion stay as they are. A change to an object a
    GitSource applied is refused (OwnedByGitSource, 409).
    """
    node = node_of(obj)
    for _ in range(attempts):
        try:
            current = await store.get(type(obj), obj.name, node=node)
        except NotFound:
            fresh = obj.model_copy(deep=True)
            fresh.status = type(obj).model_fields["status"].get_default(call_default_factory=True)
            try:
                return "created", await store.create(fresh)
            except AlreadyExists:
                continue
        if applies_nothing(current, obj):
            return "unchanged", current
        check_not_owned(current, obj)
        desired = applied(current, obj)
        try:
            return "configured", await store.update(desired)
        except Conflict:
            continue
    raise Conflict(f"{obj.kind_plural}/{obj.name} kept changing while being applied; re-run")
