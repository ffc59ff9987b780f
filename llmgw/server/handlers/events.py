"""Events: `GET /events` (every object's, ?kind='s, or ?kind=&name='s; their watch is watch.py's)
and `POST /events` (record one about an object)."""
from __future__ import annotations

from aiohttp import web

from llmgw.api import KINDS, node_of
from llmgw.api.errors import BadRequest, Invalid
from llmgw.server.authz import Action
from llmgw.server.request import Authorize, json_response, not_a_name, read_body, unknown_kind
from llmgw.store import Store

EVENT_FIELDS = ("kind", "name", "type", "reason", "message")


class Events:
    def __init__(self, store: Store, authorize: Authorize) -> None:
        self.store, self.authorize = store, authorize

    async def list(self, request: web.Request) -> web.Response:
        """Oldest first, each with its kind, name and id."""
        # ?kind= and ?name= were checked with the URL (app.py's url_action)
        kind, name = request.query.get("kind") or None, request.query.get("name") or None
        items, rev = await self.store.events.list_all(kind, name)
        return json_response({"kind": "EventList", "metadata": {"resourceVersion": rev}, "items": items})

    async def record(self, request: web.Request) -> web.Response:
        body = await read_body(request)
        for field in EVENT_FIELDS:
            if field not in body:
                raise BadRequest(f"event field {field!r} is required")
        wrong = [f"{f}: must be a string" for f in (*EVENT_FIELDS, "node")
                 if f in body and not isinstance(body[f], str) and not (f == "node" and body[f] is None)]
        if wrong:
            raise Invalid("; ".join(wrong))
        kind, name, type_, reason, message = (body[k] for k in EVENT_FIELDS)
        # what it is about: an object's kind and name (a name with '/' would file it under another's)
        about = [f"kind: {unknown_kind(kind)}"] if kind not in KINDS else []
        about += [f"{f}: {why}" for f in ("name", "node") if body.get(f) is not None
                  and (why := not_a_name(body[f])) is not None]
        if about:
            raise Invalid("; ".join(about))
        obj_node = name if kind == "nodes" else None
        if KINDS[kind].scope == "Node" and request["identity"].role == "node":
            obj_node = node_of(await self.store.get(KINDS[kind], name, node=body.get("node")))
        await self.authorize(request, Action("events-write", "events", f"{kind}/{name}", obj_node=obj_node))
        await self.store.events.record(kind, name, type_, reason, message)
        return json_response({"recorded": True}, 201)
