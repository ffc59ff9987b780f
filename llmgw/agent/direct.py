"""Direct loads: a gateway asks this agent to load a LoRA adapter into a replica's engine now
(docs/contracts.md, "Adapters"), on the agent's listener (listener.py), under /adapters/:

    POST /adapters/<adapter>/load   {"replica": R, "digest": D or null, "victim": V or null}

Only a gateway may ask (a client certificate of the cluster CA with O=llmgw:components,
CN=gateway); any other certificate is refused 403. The replica's serving shard (rank 0) must
run on this node and be Ready. The answer is 200 once the engine answered its load 200, with
`{"evicted": V or null}` (the victim, where it was unloaded: the engine was full); else the
status and the words of why not (404: no such replica or Adapter here; 409: not Ready, no
free slot and no victim it holds, another digest; 502: the pull's or the engine's words).
"""
from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from llmgw.agent.adapters import Refused
from llmgw.agent.listener import only
from llmgw.pki.ca import ORG

log = logging.getLogger(__name__)

GATEWAY = ("gateway", ORG["component"])    # CN, O of the gateway's component certificate


class DirectLoads:
    """`load(replica, adapter, digest, victim)`: the supervisor's, to the replica's serving shard
    here (the victim if it was unloaded; raises Refused)."""

    def __init__(self, load: Callable[[str, str, str | None, str | None], Awaitable[str | None]]) -> None:
        self.load = load

    def app(self) -> web.Application:
        """Its routes, under /adapters/ of the agent's listener."""
        cn, org = GATEWAY
        app = web.Application(middlewares=[only(org, "adapter load", lambda their_cn, their_org: (
            f"only a gateway (CN={cn} O={org}) asks an agent to load an adapter; CN={their_cn} O={their_org} "
            "may not"), cn=cn)])
        app.router.add_post("/{name}/load", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        try:
            body = await request.json()
        except ValueError:
            raise web.HTTPBadRequest(text="the body is not JSON") from None
        fields = {f: body.get(f) if isinstance(body, dict) else None for f in ("replica", "digest", "victim")}
        for field, value in fields.items():
            if value is not None and not isinstance(value, str) or field == "replica" and not value:
                raise web.HTTPBadRequest(text=f"{field}: a string{'' if field == 'replica' else ' or null'}, "
                                              f"not {value!r}")
        replica = str(fields["replica"])
        try:
            evicted = await self.load(replica, name, fields["digest"], fields["victim"])
        except Refused as refused:
            log.info("direct load of %s on %s refused (%d): %s", name, replica, refused.status, refused)
            return web.Response(status=refused.status, text=str(refused))
        return web.json_response({"evicted": evicted})
