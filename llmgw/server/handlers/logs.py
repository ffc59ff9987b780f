"""An engine's log: `GET shards/<name>/log`, or `replicas/<name>/log?rank=R`, relayed from the agent
of the node that runs the shard (llmgw/server/logs.py)."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping

from aiohttp import web

from llmgw.api import Node, Replica, Shard
from llmgw.api.errors import BadRequest, NotFound
from llmgw.api.logs import LogQuery, parse_rank
from llmgw.api.wellknown import REPLICA_LABEL, shard_name
from llmgw.server.authz import Action
from llmgw.server.logs import AgentLogs
from llmgw.server.request import Authorize, kind_of
from llmgw.store import Store


class Logs:
    def __init__(self, store: Store, authorize: Authorize, agents: AgentLogs) -> None:
        self.store, self.authorize, self.agents = store, authorize, agents

    async def log(self, request: web.Request) -> web.StreamResponse:
        """``shards/<name>/log``, or ``replicas/<name>/log?rank=R`` (its shard of that rank, else the
        node its placement names)."""
        kind, name = kind_of(request), request.match_info["name"]
        try:
            query = LogQuery.parse(request.query)
        except ValueError as err:
            raise BadRequest(str(err)) from None
        if kind == "shards":
            shard = await self.store.get(Shard, name, node=request.query.get("node") or None)
            shard_name, node = shard.name, shard.spec.node
        elif kind == "replicas":
            shard_name, node = await self._shard_of(name, request.query)
        else:
            raise NotFound(f"{kind} have no log (replicas and shards do)")
        await self.authorize(request, Action("log", kind, name, obj_node=node))
        node_obj = await self.store.get(Node, node)
        async with self.agents.open(node_obj, shard_name, query) as chunks:
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
            raise BadRequest(str(err)) from None
        r = await self.store.get(Replica, replica)
        name = shard_name(replica, rank)
        shards, _ = await self.store.list(Shard, selector=f"{REPLICA_LABEL}={replica}")
        node = next((s.spec.node for s in shards if s.name == name),
                    next((p.node for p in r.spec.placement if p.rank == rank), None))
        if node is None:
            raise NotFound(f"replica {replica} has no shard of rank {rank} and no placement: "
                           "no node holds its log now (`llmgw logs` the shard once it is placed)")
        return name, node


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
