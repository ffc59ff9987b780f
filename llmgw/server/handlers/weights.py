"""`GET /nodes?weights=SOURCE[&digest=sha256:...]`: the Nodes that hold or pull a model's weights,
answered from the server's index (llmgw/server/weightsindex.py)."""
from __future__ import annotations

from aiohttp import web

from llmgw.api.errors import BadRequest
from llmgw.api.sources import check_digest
from llmgw.server.request import object_list, watching
from llmgw.server.weightsindex import WeightsIndex


class WeightsQuery:
    def __init__(self, index: WeightsIndex) -> None:
        self.index = index

    async def nodes(self, request: web.Request, kind: str) -> web.Response:
        items, rev = await self.index.nodes(_refs(kind, request))
        return object_list(kind, items, rev)


def _refs(kind: str, request: web.Request) -> list[str]:
    """What `?weights=SOURCE[&digest=sha256:...]` asks for, or 400."""
    q = request.query
    if kind != "nodes" or watching(request) or {"labelSelector", "node"} & q.keys():
        raise BadRequest("weights: lists Nodes only, without watch, labelSelector or node")
    source, digest = q["weights"], q.get("digest")
    if not source:
        raise BadRequest("weights: a model's source, not empty")
    if digest is not None:
        try:
            check_digest(digest[:80])
        except ValueError as err:
            raise BadRequest(f"digest: {err}") from None
    return [source] if digest is None else [source, digest]
