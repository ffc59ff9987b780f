"""A node's heartbeat: `POST /heartbeat/<node>`, a lease of `ttl` seconds on a registered Node."""
from __future__ import annotations

from aiohttp import web

from llmgw.api import Node
from llmgw.api.errors import BadRequest
from llmgw.server.request import json_response, read_body
from llmgw.store import Store


class Heartbeats:
    def __init__(self, store: Store) -> None:
        self.store = store

    async def beat(self, request: web.Request) -> web.Response:
        node = request.match_info["node"]
        body = await read_body(request) if request.can_read_body else {}
        ttl = body.get("ttl")
        if ttl is None:   # absent or null: the default
            ttl = 15
        if not isinstance(ttl, int) or isinstance(ttl, bool) or not 1 <= ttl <= 600:
            raise BadRequest(f"ttl must be an integer number of seconds in 1..600, got {ttl!r}")
        await self.store.get(Node, node)   # NotFound (404): a heartbeat is of a registered Node
        await self.store.heartbeats.beat(node, ttl=ttl)
        return json_response({"node": node, "ttl": ttl})
