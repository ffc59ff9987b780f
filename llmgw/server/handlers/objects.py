"""Objects of every kind: list (GET /{kind}), get, create, update, delete, and apply (`llmgw apply`)."""
from __future__ import annotations

from aiohttp import web

from llmgw.api import KINDS, AnyObject, node_of
from llmgw.api.applied import applied, applies_nothing, check_not_owned
from llmgw.api.errors import AlreadyExists, BadRequest, Conflict, NotFound
from llmgw.api.selectors import Selector
from llmgw.server.authz import Action, changed_fields, written_fields
from llmgw.server.rbac import BUILTIN_ROLES
from llmgw.server.request import Authorize, dump, json_response, kind_of, object_list, read_object, shown
from llmgw.store import Store


def by_rules(request: web.Request) -> bool:
    """The request's identity is a user's, whose rules may need the stored object (its labels)."""
    return bool(request["identity"].role == "user")


class Objects:
    def __init__(self, store: Store, authorize: Authorize) -> None:
        self.store, self.authorize = store, authorize

    async def list(self, request: web.Request, kind: str) -> web.Response:
        q = request.query
        selector = q.get("labelSelector") or None
        items, rev = await self.store.list(KINDS[kind], selector=selector, node=q.get("node") or None)
        if kind == "roles":   # the built-in roles are answered beside the stored ones
            items = [*(r for r in BUILTIN_ROLES.values() if Selector.parse(selector).matches(r.metadata.labels)),
                     *items]
        return object_list(kind, [shown(request, o) for o in items], rev)

    async def get(self, request: web.Request) -> web.Response:
        kind, name = kind_of(request), request.match_info["name"]
        hint = request.query.get("node") or None
        if kind == "roles" and name in BUILTIN_ROLES:
            return json_response(dump(BUILTIN_ROLES[name]))
        if KINDS[kind].scope == "Node" or by_rules(request):   # which node it is on is known once it is read
            obj = await self.store.get(KINDS[kind], name, node=hint)
            await self.authorize(request, Action("get", kind, name, node=hint, obj_node=node_of(obj),
                                                 labels=obj.metadata.labels))
            return json_response(dump(shown(request, obj)))
        return json_response(dump(await self.store.get(KINDS[kind], name)))

    async def create(self, request: web.Request) -> web.Response:
        kind = kind_of(request)
        obj = await read_object(request, kind)
        await self.authorize(request, Action("create", kind, obj.name, obj_node=node_of(obj),
                                             fields=written_fields(obj), new_labels=obj.metadata.labels, obj=obj))
        return json_response(dump(await self.store.create(obj)), 201)

    async def update(self, request: web.Request) -> web.Response:
        kind = kind_of(request)
        obj = await read_object(request, kind)
        if by_rules(request):   # a user's rules judge the stored object and what the update sets of it
            old = await self.store.get(KINDS[kind], obj.name, node=node_of(obj))
            act = Action("update", kind, obj.name, obj_node=node_of(obj), fields=changed_fields(obj, old),
                         labels=old.metadata.labels, new_labels=obj.metadata.labels, obj=obj)
        else:
            act = Action("update", kind, obj.name, obj_node=node_of(obj))
        await self.authorize(request, act)
        if obj.metadata.resourceVersion is None:
            raise BadRequest("metadata.resourceVersion is required to update (get the object first)")
        return json_response(dump(await self.store.update(obj)))

    async def delete(self, request: web.Request) -> web.Response:
        kind, name = kind_of(request), request.match_info["name"]
        node = request.query.get("node") or None
        if by_rules(request):
            old = await self.store.get(KINDS[kind], name, node=node)
            await self.authorize(request, Action("delete", kind, name, obj_node=node_of(old),
                                                 labels=old.metadata.labels))
        return json_response(dump(await self.store.delete(KINDS[kind], name, node=node)))

    async def apply(self, request: web.Request) -> web.Response:
        kind = kind_of(request)
        obj = await read_object(request, kind)
        labels, fields = None, None
        if by_rules(request):   # what the apply would change, of the stored object if there is one
            try:
                current = await self.store.get(KINDS[kind], obj.name, node=node_of(obj))
                labels, fields = current.metadata.labels, changed_fields(applied(current, obj), current)
            except NotFound:
                fields = written_fields(obj)
        await self.authorize(request, Action("apply", kind, obj.name, obj_node=node_of(obj), fields=fields,
                                             labels=labels, new_labels=obj.metadata.labels, obj=obj))
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
