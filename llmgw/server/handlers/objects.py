"""Objects of every kind: list (GET /{kind}), get, create, update, delete, and apply (`llmgw apply`)."""
from __future__ import annotations

from aiohttp import web

from llmgw.api import KINDS, AnyObject
from llmgw.api.applied import applied, applies_nothing, check_not_owned
from llmgw.api.errors import AlreadyExists, BadRequest, Conflict, NotFound
from llmgw.api.types import node_of
from llmgw.server.authz import Action, written_fields
from llmgw.server.request import Authorize, dump, json_response, kind_of, object_list, read_object
from llmgw.store import Store


class Objects:
    def __init__(self, store: Store, authorize: Authorize) -> None:
        self.store, self.authorize = store, authorize

    async def list(self, request: web.Request, kind: str) -> web.Response:
        q = request.query
        items, rev = await self.store.list(KINDS[kind], selector=q.get("labelSelector") or None,
                                           node=q.get("node") or None)
        return object_list(kind, items, rev)

    async def get(self, request: web.Request) -> web.Response:
        kind, name = kind_of(request), request.match_info["name"]
        hint = request.query.get("node") or None
        if KINDS[kind].scope == "Node":   # which node it is on is known once it is read
            obj = await self.store.get(KINDS[kind], name, node=hint)
            await self.authorize(request, Action("get", kind, name, node=hint, obj_node=node_of(obj)))
            return json_response(dump(obj))
        return json_response(dump(await self.store.get(KINDS[kind], name)))

    async def create(self, request: web.Request) -> web.Response:
        kind = kind_of(request)
        obj = await read_object(request, kind)
        await self.authorize(request, Action("create", kind, obj.name, obj_node=node_of(obj),
                                             fields=written_fields(obj)))
        return json_response(dump(await self.store.create(obj)), 201)

    async def update(self, request: web.Request) -> web.Response:
        kind = kind_of(request)
        obj = await read_object(request, kind)
        await self.authorize(request, Action("update", kind, obj.name, obj_node=node_of(obj)))
        if obj.metadata.resourceVersion is None:
            raise BadRequest("metadata.resourceVersion is required to update (get the object first)")
        return json_response(dump(await self.store.update(obj)))

    async def delete(self, request: web.Request) -> web.Response:
        kind, name = kind_of(request), request.match_info["name"]
        return json_response(dump(await self.store.delete(KINDS[kind], name, node=request.query.get("node") or None)))

    async def apply(self, request: web.Request) -> web.Response:
        kind = kind_of(request)
        obj = await read_object(request, kind)
        await self.authorize(request, Action("apply", kind, obj.name, obj_node=node_of(obj)))
        result, out = await apply_object(self.store, obj)
        return json_response({"result": result, "object": dump(out)}, 201 if result == "created" else 200)


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
